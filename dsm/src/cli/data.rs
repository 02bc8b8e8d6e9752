//! Bytes in and out of the one-shot commands: `write --file PATH|-` and `read --out PATH|-`, of
//! any length, in pieces of [`CHUNK`] so memory stays bounded (stdin, whose length is unknown
//! until read, is held whole, up to the room left in the window). The range is checked against
//! the directory before the first byte moves.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use rocefabric_dsm::{Directory, Dsm, DsmError};

/// Bytes per RDMA call and per file read or write.
pub const CHUNK: usize = 4 << 20;

/// Largest read printed as hex; longer ones need `--out`.
pub const HEX_MAX: u64 = 64 << 10;

/// What the data commands need of the fabric's memory: [`Dsm`] in the binary, a plain buffer in
/// tests.
pub trait Memory {
    fn directory(&self) -> &Directory;
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DsmError>;
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), DsmError>;
}

impl Memory for Dsm {
    fn directory(&self) -> &Directory {
        Dsm::directory(self)
    }
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DsmError> {
        Dsm::read(self, addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), DsmError> {
        Dsm::write(self, addr, data)
    }
}

/// Fill `buf` from `src` as far as it goes; the count is short only at the end of `src`.
fn fill(src: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Where `write --file` takes its bytes from, opened before the HCA is (a wrong path fails first).
pub enum Input {
    Stdin,
    /// A regular file of known length, named as given.
    File(File, u64, String),
    /// A FIFO or device: its length is known only once read.
    Stream(File, String),
}

impl Input {
    /// Open `path` (`-`: stdin).
    pub fn open(path: &Path) -> Result<Input> {
        if path == Path::new("-") {
            return Ok(Input::Stdin);
        }
        let shown = format!("--file {}", path.display());
        let file = File::open(path).with_context(|| shown.clone())?;
        let meta = file.metadata().with_context(|| shown.clone())?;
        anyhow::ensure!(!meta.is_dir(), "{shown}: a directory");
        Ok(if meta.is_file() {
            Input::File(file, meta.len(), shown)
        } else {
            Input::Stream(file, shown)
        })
    }
}

/// Write all of `input` at `at`; returns how many bytes.
pub fn write_input(mem: &mut impl Memory, at: u64, input: Input) -> Result<u64> {
    let (mut file, len, shown) = match input {
        Input::Stdin => return write_stream(mem, at, &mut std::io::stdin().lock()),
        Input::Stream(mut f, shown) => {
            return write_stream(mem, at, &mut f).with_context(|| shown);
        }
        Input::File(file, len, shown) => (file, len, shown),
    };
    mem.directory().owner(at, len)?;
    let mut buf = vec![0u8; CHUNK.min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(CHUNK as u64) as usize;
        let n = fill(&mut file, &mut buf[..want]).with_context(|| shown.clone())?;
        anyhow::ensure!(
            n == want,
            "{shown}: ended after {} of its {len} bytes",
            done + n as u64
        );
        mem.write(at + done, &buf[..n])?;
        done += n as u64;
    }
    Ok(len)
}

/// Write all of `src` at `at`, nothing if it does not fit in the window that holds `at`.
fn write_stream(mem: &mut impl Memory, at: u64, src: &mut impl Read) -> Result<u64> {
    let room = mem.directory().owner(at, 1)?.end() - at;
    let mut data = Vec::new();
    src.take(room.saturating_add(1))
        .read_to_end(&mut data)
        .context("reading the input")?;
    if let Err(e) = mem.directory().owner(at, data.len() as u64) {
        anyhow::bail!("{e} (the input is longer than the {room} bytes from there to the end)");
    }
    if !data.is_empty() {
        mem.write(at, &data)?;
    }
    Ok(data.len() as u64)
}

/// Copy `len` bytes at `at` to `out`, a piece at a time.
pub fn read_to(mem: &mut impl Memory, at: u64, len: u64, out: &mut impl Write) -> Result<()> {
    mem.directory().owner(at, len)?;
    let mut buf = vec![0u8; CHUNK.min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        mem.read(at + done, &mut buf[..n])?;
        out.write_all(&buf[..n]).context("writing the bytes read")?;
        done += n as u64;
    }
    out.flush().context("writing the bytes read")
}

/// `read --out PATH`: the bytes go to a temporary file beside `path`, renamed over it once all are
/// there, so a failed read leaves no partial file. A device or FIFO at `path` is written directly.
pub fn read_to_file(mem: &mut impl Memory, at: u64, len: u64, path: &Path) -> Result<()> {
    let shown = path.display();
    if path == Path::new("-") {
        return read_to(mem, at, len, &mut std::io::stdout().lock());
    }
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        let mut out = File::options()
            .write(true)
            .open(path)
            .with_context(|| format!("--out {shown}"))?;
        return read_to(mem, at, len, &mut out);
    }
    mem.directory().owner(at, len)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("--out {shown}"))?;
    read_to(
        mem,
        at,
        len,
        &mut std::io::BufWriter::new(tmp.as_file_mut()),
    )?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("--out {shown}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One window `a` at [0x1000, 0x1000 + size) backed by a buffer; counts the calls.
    struct Window {
        directory: Directory,
        bytes: Vec<u8>,
        calls: usize,
    }

    const BASE: u64 = 0x1000;

    fn window(size: usize) -> Window {
        let text = format!(r#"[{{"pod":"a","id":0,"base":{BASE},"size":{size}}}]"#);
        Window {
            directory: Directory::parse("test", &text).unwrap(),
            bytes: vec![0; size],
            calls: 0,
        }
    }

    impl Memory for Window {
        fn directory(&self) -> &Directory {
            &self.directory
        }
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DsmError> {
            self.directory.owner(addr, buf.len() as u64)?;
            self.calls += 1;
            let at = (addr - BASE) as usize;
            buf.copy_from_slice(&self.bytes[at..at + buf.len()]);
            Ok(())
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), DsmError> {
            self.directory.owner(addr, data.len() as u64)?;
            self.calls += 1;
            let at = (addr - BASE) as usize;
            self.bytes[at..at + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn a_file_longer_than_a_chunk_is_written_in_pieces_and_read_back_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.bin");
        let data = pattern(CHUNK * 2 + 12345);
        std::fs::write(&input, &data).unwrap();
        let mut w = window(CHUNK * 3);
        let n = write_input(&mut w, BASE + 16, Input::open(&input).unwrap()).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(w.calls, 3, "one RDMA write per chunk");
        assert_eq!(&w.bytes[16..16 + data.len()], &data[..]);
        let output = dir.path().join("out.bin");
        read_to_file(&mut w, BASE + 16, data.len() as u64, &output).unwrap();
        assert_eq!(std::fs::read(&output).unwrap(), data);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temporary file is left");
    }

    #[test]
    fn a_file_that_does_not_fit_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.bin");
        std::fs::write(&input, pattern(100)).unwrap();
        let mut w = window(4096);
        let e = write_input(&mut w, BASE + 4000, Input::open(&input).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "address {:#x} (+100 bytes): out of window: pod a holds [0x1000, 0x2000)",
                BASE + 4000
            )
        );
        assert_eq!(w.calls, 0);
        let Err(e) = Input::open(&dir.path().join("missing")) else {
            panic!("opened a missing file")
        };
        assert!(format!("{e:#}").starts_with("--file "), "{e:#}");
        assert!(Input::open(dir.path()).is_err(), "a directory is no input");
    }

    #[test]
    fn stdin_is_written_whole_or_not_at_all() {
        let mut w = window(4096);
        let data = pattern(1000);
        let n = write_stream(&mut w, BASE + 96, &mut &data[..]).unwrap();
        assert_eq!((n, w.calls), (1000, 1));
        assert_eq!(&w.bytes[96..1096], &data[..]);
        let long = pattern(5000);
        let e = write_stream(&mut w, BASE + 96, &mut &long[..]).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with(&format!(
                "address {:#x} (+4001 bytes): out of window",
                BASE + 96
            )),
            "{e}"
        );
        assert!(e.contains("longer than the 4000 bytes"), "{e}");
        assert_eq!(w.calls, 1, "nothing more was written");
        assert_eq!(write_stream(&mut w, BASE, &mut &[][..]).unwrap(), 0);
    }

    #[test]
    fn a_read_goes_out_raw_in_pieces_and_an_out_of_window_one_creates_no_file() {
        let mut w = window(CHUNK + 64);
        w.bytes = pattern(CHUNK + 64);
        let mut out = Vec::new();
        read_to(&mut w, BASE + 32, CHUNK as u64 + 32, &mut out).unwrap();
        assert_eq!(out, &w.bytes[32..]);
        assert_eq!(w.calls, 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        let e = read_to_file(&mut w, BASE + 32, CHUNK as u64 + 33, &path).unwrap_err();
        assert!(e.to_string().contains("out of window: pod a"), "{e}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
        let e = read_to(&mut w, 0x10, 8, &mut Vec::new()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "address 0x10: not assigned to any pod in the directory"
        );
    }
}
