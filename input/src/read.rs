//! Reads with a size cap.
//!
//! Two kinds of file come in from outside:
//! - files a user names (configs, snapshots): any readable file, FIFO or `/dev/stdin` is fine
//!   (`--pods <(kubectl get pods -A -o json)` works), but at most `limit` bytes are read, so
//!   `/dev/zero` is an error instead of an out-of-memory kill;
//! - kernel attributes (sysfs, procfs): opened non-blocking and refused unless a regular file, so a
//!   FIFO or a device planted in a tree cannot stall the daemon, and capped at
//!   [`ATTR_LIMIT`] (the kernel's own attribute pages are one 4 KiB page).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Most bytes read from one sysfs or procfs attribute.
pub const ATTR_LIMIT: u64 = 16 * 1024;

/// A file that could not be read, naming it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is larger than the {} limit", human(*limit))]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is not UTF-8 text (first bad byte at offset {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
}

impl ReadError {
    /// The I/O error kind, when the failure was an I/O error (e.g. `NotFound`).
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            ReadError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

/// `1 MiB`, `16 KiB`, `1536 bytes`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("bytes", 1),
    ];
    for (unit, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// Read the file a user named, as text, refusing more than `limit` bytes.
pub fn read_file(path: &Path, limit: u64) -> Result<String, ReadError> {
    capped(open_named(path, limit)?, path, limit)
}

/// A reader over the file a user named that fails once more than `limit` bytes were read: for
/// streaming parsers.
pub fn open_file(path: &Path, limit: u64) -> Result<impl Read, ReadError> {
    Ok(Capped {
        inner: std::io::BufReader::with_capacity(256 * 1024, open_named(path, limit)?),
        left: limit,
        path: path.to_path_buf(),
    })
}

/// Open a file a user named: not a directory, and not a regular file known to be over `limit`
/// (a FIFO or device is read up to the limit instead).
fn open_named(path: &Path, limit: u64) -> Result<File, ReadError> {
    let file = File::open(path).map_err(|source| io(path, source))?;
    let meta = file.metadata().map_err(|source| io(path, source))?;
    if meta.is_dir() {
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind: "directory",
        });
    }
    if meta.is_file() && meta.len() > limit {
        return Err(too_large(path, limit));
    }
    Ok(file)
}

/// Read a kernel attribute (sysfs, procfs) as text: non-blocking, regular files only, at most
/// [`ATTR_LIMIT`] bytes.
pub fn read_attr(path: &Path) -> Result<String, ReadError> {
    read_regular(path, ATTR_LIMIT)
}

/// Read a file the program keeps itself (a checkpoint) as text: opened without blocking, regular
/// files only (a FIFO, device or socket planted there is refused at once), at most `limit`
/// bytes.
pub fn read_regular(path: &Path, limit: u64) -> Result<String, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| io(path, source))?;
    let kind = file
        .metadata()
        .map_err(|source| io(path, source))?
        .file_type();
    if !kind.is_file() {
        let kind = if kind.is_fifo() {
            "FIFO"
        } else if kind.is_char_device() {
            "character device"
        } else if kind.is_block_device() {
            "block device"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_dir() {
            "directory"
        } else {
            "special file"
        };
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    capped(file, path, limit)
}

/// [`read_attr`], trimmed, or `None` when it cannot be read: for optional attributes.
pub fn attr(path: &Path) -> Option<String> {
    read_attr(path).ok().map(|s| s.trim().to_string())
}

fn capped(file: File, path: &Path, limit: u64) -> Result<String, ReadError> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| io(path, source))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(path, limit));
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })
}

struct Capped<R> {
    inner: R,
    left: u64,
    path: PathBuf,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more tells "exactly at the limit" from "over it".
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(format!(
                    "{} is larger than the limit",
                    self.path.display()
                ))),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

fn io(path: &Path, source: std::io::Error) -> ReadError {
    ReadError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn too_large(path: &Path, limit: u64) -> ReadError {
    ReadError::TooLarge {
        path: path.to_path_buf(),
        limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_device_is_capped_not_read_whole() {
        let e = read_file(Path::new("/dev/zero"), 1024).expect_err("/dev/zero never ends");
        assert!(matches!(e, ReadError::TooLarge { limit: 1024, .. }), "{e}");
        assert_eq!(e.to_string(), "/dev/zero is larger than the 1 KiB limit");
    }

    #[test]
    fn a_file_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, "x".repeat(100)).expect("write");
        assert_eq!(read_file(&p, 100).expect("at limit").len(), 100);
        assert!(matches!(read_file(&p, 99), Err(ReadError::TooLarge { .. })));
        let mut r = open_file(&p, 100).expect("open");
        let mut s = String::new();
        r.read_to_string(&mut s).expect("at limit streams");
        assert_eq!(s.len(), 100);
        assert!(open_file(&p, 99).is_err());
    }

    #[test]
    fn regular_reads_take_their_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("state.json");
        std::fs::write(&p, b"12345").expect("write");
        assert_eq!(read_regular(&p, 5).expect("at limit"), "12345");
        assert!(matches!(
            read_regular(&p, 4),
            Err(ReadError::TooLarge { .. })
        ));
        assert_eq!(
            read_regular(&dir.path().join("missing"), 5)
                .expect_err("missing")
                .io_kind(),
            Some(std::io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn attributes_refuse_fifos_and_devices_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("operstate");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads a NUL-terminated path that outlives the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo");
        let e = read_attr(&fifo).expect_err("a FIFO is refused");
        assert!(
            matches!(e, ReadError::NotRegular { kind: "FIFO", .. }),
            "{e}"
        );
        let e = read_attr(Path::new("/dev/zero")).expect_err("a device is refused");
        assert!(
            matches!(
                e,
                ReadError::NotRegular {
                    kind: "character device",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn huge_attributes_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("numa_node");
        std::fs::write(&p, "1".repeat(1 << 20)).expect("write");
        let e = read_attr(&p).expect_err("1 MiB attribute");
        assert!(
            e.to_string().ends_with("larger than the 16 KiB limit"),
            "{e}"
        );
        std::fs::write(&p, "0\n").expect("write");
        assert_eq!(attr(&p).as_deref(), Some("0"));
    }

    #[test]
    fn non_utf8_names_the_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"ab\xffcd").expect("write");
        let e = read_file(&p, 100).expect_err("not UTF-8");
        assert!(e.to_string().contains("offset 2"), "{e}");
    }
}
