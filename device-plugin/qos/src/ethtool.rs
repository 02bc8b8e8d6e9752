//! Driver statistics by name (what `ethtool -S IF` prints), over the `SIOCETHTOOL` ioctl.
//!
//! Why this module holds `unsafe` (one of the three files the README's Choices list): mlx5 exposes
//! its per-priority pause durations and pause-storm events only as driver statistics, and the
//! kernel hands those out only through `SIOCETHTOOL` (`ETHTOOL_GSSET_INFO`, `ETHTOOL_GSTRINGS` for
//! `ETH_SS_STATS`, `ETHTOOL_GSTATS`); ethtool netlink carries standard statistic groups but not
//! driver-private ones. No well-kept crate offers these calls behind a safe API that keeps the
//! errno (the one that exists, `below-ethtool`, reports every ioctl failure as the return value
//! `-1` instead of errno, so EOPNOTSUPP cannot be told apart, and sizes its buffers without
//! headroom); `nix` and `rustix` only provide unsafe ioctl wrappers. So the ioctl is issued here,
//! in one function ([`ethtool_ioctl`]), with every buffer allocated in safe Rust and sized by its
//! caller.
//!
//! Layouts (include/uapi/linux/ethtool.h; the buffers are `Vec<u64>`, so 8-byte aligned):
//! - `struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }`: one mask
//!   bit asked, so at most one `u32` is written at byte 16 (24 bytes in all);
//! - `struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[len * 32]; }`: names at
//!   byte 12, 32 bytes each (NUL-padded);
//! - `struct ethtool_stats { u32 cmd; u32 n_stats; u64 data[n_stats]; }`: values at byte 8;
//! - `struct ifreq` (libc's definition): `ifr_name[16]` then the union whose `ifru_data` points at
//!   the command buffer.
//!
//! The kernel ignores the `len`/`n_stats` it is given and writes as many entries as the driver
//! counts at that moment, which can grow between the calls (more channels, for example). Buffers
//! are therefore allocated with headroom (twice the announced count plus 1024 entries), the count
//! the kernel writes back is checked against the capacity, and the whole read is retried when the
//! counts of the three calls disagree.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

use socket2::{Domain, Socket, Type};

/// `SIOCETHTOOL` (include/uapi/linux/sockios.h).
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// Get a string set (include/uapi/linux/ethtool.h).
const ETHTOOL_GSTRINGS: u32 = 0x1b;
/// Get driver statistics.
const ETHTOOL_GSTATS: u32 = 0x1d;
/// Get the sizes of string sets.
const ETHTOOL_GSSET_INFO: u32 = 0x37;
/// `enum ethtool_stringset`: statistic names, for `ETHTOOL_GSTATS`.
const ETH_SS_STATS: u32 = 1;
/// Bytes per name in `ETHTOOL_GSTRINGS`.
pub const ETH_GSTRING_LEN: usize = 32;
/// Most statistics accepted from one driver (mlx5 with 256 channels reports about 15 000).
pub const MAX_STATS: usize = 1 << 16;
/// Reads attempted before giving up on a driver whose statistics keep changing size.
const ATTEMPTS: usize = 3;

/// `sizeof(struct ethtool_gstrings)`: the names start here.
const GSTRINGS_HEADER: usize = 12;
/// `sizeof(struct ethtool_stats)`: the values start here.
const GSTATS_HEADER: usize = 8;
/// `offsetof(struct ethtool_sset_info, data)`.
const SSET_INFO_DATA: usize = 16;

/// Why driver statistics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EthtoolError {
    #[error("{name:?} is not a valid interface name (1 to 15 bytes, no NUL, '/' or whitespace)")]
    InvalidName { name: String },
    #[error("no network interface named {netdev:?}")]
    NoSuchInterface { netdev: String },
    #[error("{netdev}: no driver statistics (EOPNOTSUPP: the driver has no ETH_SS_STATS set)")]
    NoDriverStats { netdev: String },
    #[error("{netdev}: cannot open an AF_INET datagram socket for SIOCETHTOOL: {source}")]
    Socket {
        netdev: String,
        #[source]
        source: io::Error,
    },
    #[error("{netdev}: SIOCETHTOOL {command} failed: {source}")]
    Ioctl {
        netdev: String,
        command: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{netdev}: the driver reports {count} statistics, more than the {max} accepted")]
    TooMany {
        netdev: String,
        count: usize,
        max: usize,
    },
    #[error(
        "{netdev}: the driver's statistics changed size while being read ({detail}), {attempts} times in a row"
    )]
    Unstable {
        netdev: String,
        detail: String,
        attempts: usize,
    },
}

/// The driver statistics of `netdev` as `(name, value)`, in the driver's order (`ethtool -S`).
pub fn driver_stats(netdev: &str) -> Result<Vec<(String, u64)>, EthtoolError> {
    let name = ifr_name(netdev)?;
    let socket =
        Socket::new(Domain::IPV4, Type::DGRAM, None).map_err(|source| EthtoolError::Socket {
            netdev: netdev.to_string(),
            source,
        })?;
    let dev = Device {
        socket: &socket,
        name,
        netdev,
    };
    let mut detail = String::new();
    for _ in 0..ATTEMPTS {
        let count = dev.stats_count()?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let names = dev.names(count)?;
        if names.len() != count {
            detail = format!("{count} announced, {} names", names.len());
            continue;
        }
        let values = dev.values(count)?;
        if values.len() != count {
            detail = format!("{count} names, {} values", values.len());
            continue;
        }
        return Ok(names.into_iter().zip(values).collect());
    }
    Err(EthtoolError::Unstable {
        netdev: netdev.to_string(),
        detail,
        attempts: ATTEMPTS,
    })
}

/// `ifr_name`: the name NUL-padded to `IFNAMSIZ` (names the kernel could never have refused).
fn ifr_name(netdev: &str) -> Result<[libc::c_char; libc::IFNAMSIZ], EthtoolError> {
    let bytes = netdev.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= libc::IFNAMSIZ
        || bytes
            .iter()
            .any(|b| *b == 0 || *b == b'/' || b.is_ascii_whitespace())
    {
        return Err(EthtoolError::InvalidName {
            name: netdev.to_string(),
        });
    }
    let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
    for (dst, src) in name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(name)
}

struct Device<'a> {
    socket: &'a Socket,
    name: [libc::c_char; libc::IFNAMSIZ],
    netdev: &'a str,
}

impl Device<'_> {
    /// `ETHTOOL_GSSET_INFO` for `ETH_SS_STATS`: how many statistics the driver has now.
    fn stats_count(&self) -> Result<usize, EthtoolError> {
        let mut buf = vec![0u64; 3];
        put_u32(&mut buf, 0, ETHTOOL_GSSET_INFO);
        buf[1] = 1 << ETH_SS_STATS;
        self.ioctl(&mut buf, "ETHTOOL_GSSET_INFO", SSET_INFO_DATA + 4)?;
        let count = decode_sset_info(&buf).ok_or_else(|| EthtoolError::NoDriverStats {
            netdev: self.netdev.to_string(),
        })?;
        self.check_count(count)
    }

    /// `ETHTOOL_GSTRINGS` for `ETH_SS_STATS`: the names, as many as the kernel wrote.
    fn names(&self, count: usize) -> Result<Vec<String>, EthtoolError> {
        let capacity = with_headroom(count);
        let mut buf = vec![0u64; (GSTRINGS_HEADER + capacity * ETH_GSTRING_LEN).div_ceil(8)];
        put_u32(&mut buf, 0, ETHTOOL_GSTRINGS);
        put_u32(&mut buf, 4, ETH_SS_STATS);
        put_u32(&mut buf, 8, count_u32(count));
        self.ioctl(
            &mut buf,
            "ETHTOOL_GSTRINGS",
            GSTRINGS_HEADER + capacity * ETH_GSTRING_LEN,
        )?;
        let written = self.check_written(get_u32(&buf, 8), capacity, "ETHTOOL_GSTRINGS")?;
        Ok(decode_names(&buf, written))
    }

    /// `ETHTOOL_GSTATS`: the values, as many as the kernel wrote.
    fn values(&self, count: usize) -> Result<Vec<u64>, EthtoolError> {
        let capacity = with_headroom(count);
        let mut buf = vec![0u64; 1 + capacity];
        put_u32(&mut buf, 0, ETHTOOL_GSTATS);
        put_u32(&mut buf, 4, count_u32(count));
        self.ioctl(&mut buf, "ETHTOOL_GSTATS", GSTATS_HEADER + capacity * 8)?;
        let written = self.check_written(get_u32(&buf, 4), capacity, "ETHTOOL_GSTATS")?;
        Ok(buf[1..=written].to_vec())
    }

    fn check_count(&self, count: usize) -> Result<usize, EthtoolError> {
        if count > MAX_STATS {
            return Err(EthtoolError::TooMany {
                netdev: self.netdev.to_string(),
                count,
                max: MAX_STATS,
            });
        }
        Ok(count)
    }

    /// The entry count the kernel wrote back, which must fit the buffer it wrote into.
    fn check_written(
        &self,
        written: u32,
        capacity: usize,
        command: &'static str,
    ) -> Result<usize, EthtoolError> {
        let written = written as usize;
        if written > capacity {
            return Err(EthtoolError::Unstable {
                netdev: self.netdev.to_string(),
                detail: format!("{command} wrote {written} entries into room for {capacity}"),
                attempts: 1,
            });
        }
        Ok(written)
    }

    /// Issue one `SIOCETHTOOL` with `buf` as the command buffer. `room` is the size in bytes the
    /// command may write, which the caller computed from the layout; it must fit `buf`.
    fn ioctl(
        &self,
        buf: &mut [u64],
        command: &'static str,
        room: usize,
    ) -> Result<(), EthtoolError> {
        ethtool_ioctl(self.socket, self.name, buf, room).map_err(|source| {
            match source.raw_os_error() {
                Some(libc::EOPNOTSUPP) => EthtoolError::NoDriverStats {
                    netdev: self.netdev.to_string(),
                },
                Some(libc::ENODEV) => EthtoolError::NoSuchInterface {
                    netdev: self.netdev.to_string(),
                },
                _ => EthtoolError::Ioctl {
                    netdev: self.netdev.to_string(),
                    command,
                    source,
                },
            }
        })
    }
}

/// The one unsafe call: `ioctl(fd, SIOCETHTOOL, &ifreq)` with `ifreq.ifr_data = buf`.
fn ethtool_ioctl(
    socket: &Socket,
    name: [libc::c_char; libc::IFNAMSIZ],
    buf: &mut [u64],
    room: usize,
) -> io::Result<()> {
    // The caller's layout arithmetic says how much the kernel may write; refuse (rather than let
    // the kernel overrun) a buffer smaller than that. A true invariant of this module's callers.
    if std::mem::size_of_val(buf) < room {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("buffer of {} bytes for {room}", std::mem::size_of_val(buf)),
        ));
    }
    let mut ifr = libc::ifreq {
        ifr_name: name,
        ifr_ifru: libc::__c_anonymous_ifr_ifru {
            ifru_data: buf.as_mut_ptr().cast::<libc::c_char>(),
        },
    };
    // SAFETY: `ifr` is a valid, initialised `struct ifreq` (libc's layout: 16-byte NUL-terminated
    // name, then the union) living across the call; `ifru_data` points at `buf`, an exclusively
    // borrowed, 8-byte aligned buffer of at least `room` bytes, where `room` is the most the
    // command in its first word can write for the entry count announced by the driver, with
    // headroom for growth (see the module docs). The socket fd is open for the borrow's lifetime.
    // The kernel reads and writes only `ifr` and that buffer; nothing is retained after return.
    let rc = unsafe {
        libc::ioctl(
            socket.as_raw_fd(),
            SIOCETHTOOL as _,
            &mut ifr as *mut libc::ifreq,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Entries to make room for when the driver announced `count`.
fn with_headroom(count: usize) -> usize {
    count.saturating_mul(2).saturating_add(1024)
}

/// `count` fits u32 once checked against [`MAX_STATS`].
fn count_u32(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// Write a native-endian `u32` at byte `offset` of a word buffer.
fn put_u32(buf: &mut [u64], offset: usize, value: u32) {
    let word = &mut buf[offset / 8];
    let mut bytes = word.to_ne_bytes();
    let at = offset % 8;
    bytes[at..at + 4].copy_from_slice(&value.to_ne_bytes());
    *word = u64::from_ne_bytes(bytes);
}

/// Read a native-endian `u32` at byte `offset` of a word buffer.
fn get_u32(buf: &[u64], offset: usize) -> u32 {
    let bytes = buf[offset / 8].to_ne_bytes();
    let at = offset % 8;
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The `ETH_SS_STATS` count from an answered `ethtool_sset_info`, `None` when the kernel cleared
/// the mask bit (the driver has no such set: newer kernels answer that instead of EOPNOTSUPP).
fn decode_sset_info(buf: &[u64]) -> Option<usize> {
    let mask = buf.get(1).copied().unwrap_or(0);
    if mask & (1 << ETH_SS_STATS) == 0 {
        return None;
    }
    Some(get_u32(buf, SSET_INFO_DATA) as usize)
}

/// `count` names from an answered `ethtool_gstrings`: each up to its first NUL (all 32 bytes when
/// a driver filled them), invalid UTF-8 replaced.
fn decode_names(buf: &[u64], count: usize) -> Vec<String> {
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bytes
        .get(GSTRINGS_HEADER..)
        .unwrap_or_default()
        .chunks_exact(ETH_GSTRING_LEN)
        .take(count)
        .map(|chunk| {
            let end = chunk.iter().position(|b| *b == 0).unwrap_or(chunk.len());
            String::from_utf8_lossy(&chunk[..end]).into_owned()
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;

    /// A byte image as the kernel writes it, turned into the word buffer the ioctl uses.
    fn words(bytes: &[u8]) -> Vec<u64> {
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().div_ceil(8) * 8, 0);
        padded
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn request_headers_follow_the_uapi_layouts() {
        let mut buf = vec![0u64; 3];
        put_u32(&mut buf, 0, ETHTOOL_GSTRINGS);
        put_u32(&mut buf, 4, ETH_SS_STATS);
        put_u32(&mut buf, 8, 7);
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[0..4], &0x1bu32.to_ne_bytes(), "cmd at 0");
        assert_eq!(&bytes[4..8], &1u32.to_ne_bytes(), "string_set at 4");
        assert_eq!(&bytes[8..12], &7u32.to_ne_bytes(), "len at 8");
        assert_eq!(get_u32(&buf, 4), 1);
        assert_eq!(get_u32(&buf, 8), 7);
    }

    #[test]
    fn sset_info_answer_gives_the_stats_count_or_none_when_the_bit_is_cleared() {
        let mut image = Vec::new();
        image.extend_from_slice(&ETHTOOL_GSSET_INFO.to_ne_bytes());
        image.extend_from_slice(&0u32.to_ne_bytes());
        image.extend_from_slice(&(1u64 << ETH_SS_STATS).to_ne_bytes());
        image.extend_from_slice(&42u32.to_ne_bytes());
        assert_eq!(decode_sset_info(&words(&image)), Some(42));
        image[8..16].copy_from_slice(&0u64.to_ne_bytes());
        assert_eq!(decode_sset_info(&words(&image)), None);
    }

    #[test]
    fn names_are_32_byte_nul_padded_slots_after_a_12_byte_header() {
        let mut image = vec![0u8; GSTRINGS_HEADER];
        for name in [
            b"rx_prio3_pause".as_slice(),
            b"tx_pause_storm_warning_events",
            // A full 32-byte name without NUL is kept whole.
            b"abcdefghijklmnopqrstuvwxyz012345",
        ] {
            let mut slot = [0u8; ETH_GSTRING_LEN];
            slot[..name.len()].copy_from_slice(name);
            image.extend_from_slice(&slot);
        }
        let names = decode_names(&words(&image), 3);
        assert_eq!(
            names,
            [
                "rx_prio3_pause",
                "tx_pause_storm_warning_events",
                "abcdefghijklmnopqrstuvwxyz012345"
            ]
        );
        assert_eq!(decode_names(&words(&image), 2).len(), 2);
        assert_eq!(
            decode_names(&words(&image), 9).len(),
            3,
            "never past the data"
        );
    }

    #[test]
    fn interface_names_are_checked_before_any_ioctl() {
        for bad in ["", "a/b", "with space", "sixteen-chars-xx", "nul\0"] {
            let err = driver_stats(bad).unwrap_err();
            assert!(
                matches!(&err, EthtoolError::InvalidName { name } if name == bad),
                "{bad:?}: {err}"
            );
        }
        let name = ifr_name("veth0").unwrap();
        assert_eq!(
            name[..6],
            [b'v', b'e', b't', b'h', b'0', 0].map(|b| b as libc::c_char)
        );
    }

    #[test]
    fn a_buffer_smaller_than_the_command_may_write_is_refused() {
        let socket = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        let mut buf = vec![0u64; 1];
        let err = ethtool_ioctl(&socket, ifr_name("lo").unwrap(), &mut buf, 24).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn headroom_covers_growth() {
        assert_eq!(with_headroom(0), 1024);
        assert_eq!(with_headroom(100), 1224);
        assert!(with_headroom(MAX_STATS) > MAX_STATS);
    }
}
