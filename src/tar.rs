//! A small POSIX (pax) tar writer for `redbfs export --tar`: every entry carries a pax header
//! with its exact UTF-8 path and nanosecond mtime, so long and Unicode names round-trip
//! through GNU tar, bsdtar and Python's tarfile.

use std::io::{self, Write};

use crate::tools::EntryInfo;

const BLOCK: usize = 512;

fn octal(field: &mut [u8], value: u64) {
    // Right-aligned octal digits, zero-padded, with a trailing NUL.
    let width = field.len() - 1;
    let digits = format!("{value:0width$o}");
    let digits = digits.as_bytes();
    let start = digits.len().saturating_sub(width);
    field[..width].copy_from_slice(&digits[start..]);
    field[width] = 0;
}

fn header(
    name: &[u8],
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: u64,
    kind: u8,
) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let n = name.len().min(100);
    h[..n].copy_from_slice(&name[..n]);
    octal(&mut h[100..108], u64::from(mode & 0o7777));
    octal(&mut h[108..116], u64::from(uid));
    octal(&mut h[116..124], u64::from(gid));
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let ck = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(ck.as_bytes());
    h
}

fn pad(out: &mut dyn Write, len: usize) -> io::Result<()> {
    let rem = len % BLOCK;
    if rem != 0 {
        out.write_all(&[0u8; BLOCK][..BLOCK - rem])?;
    }
    Ok(())
}

/// One pax record: "<len> <key>=<value>\n", where len counts the whole record.
fn record(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}")
}

/// Writes one entry: a pax header, the ustar header, and the content padded to a block.
pub fn write_entry(out: &mut dyn Write, path: &str, e: &EntryInfo, data: &[u8]) -> io::Result<()> {
    let secs = e.mtime_ns.div_euclid(1_000_000_000);
    let nanos = e.mtime_ns.rem_euclid(1_000_000_000);
    let pax = format!(
        "{}{}",
        record("path", path),
        record("mtime", &format!("{secs}.{nanos:09}"))
    );
    let mtime = secs.max(0) as u64;
    out.write_all(&header(
        b"././@PaxHeader",
        0o644,
        0,
        0,
        pax.len() as u64,
        mtime,
        b'x',
    ))?;
    out.write_all(pax.as_bytes())?;
    pad(out, pax.len())?;
    let kind = if e.kind == "dir" { b'5' } else { b'0' };
    let ascii: Vec<u8> = path
        .bytes()
        .map(|b| if b.is_ascii() { b } else { b'_' })
        .collect();
    out.write_all(&header(
        &ascii,
        e.mode,
        e.uid,
        e.gid,
        data.len() as u64,
        mtime,
        kind,
    ))?;
    out.write_all(data)?;
    pad(out, data.len())
}

/// Ends the archive with two zero blocks.
pub fn finish(out: &mut dyn Write) -> io::Result<()> {
    out.write_all(&[0u8; 2 * BLOCK])?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        let r = record("path", "a");
        assert_eq!(r, "9 path=a\n");
        assert_eq!(r.len(), 9);
        let long = record("path", &"x".repeat(95));
        assert_eq!(
            long.len(),
            long.split(' ').next().unwrap().parse::<usize>().unwrap()
        );
    }

    #[test]
    fn header_checksum_is_valid() {
        let h = header(b"a.md", 0o644, 1, 2, 5, 1_700_000_000, b'0');
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let mut copy = h;
        copy[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, copy.iter().map(|&b| u32::from(b)).sum::<u32>());
    }
}
