//! Helpers for tests that drive `Fs` directly over a store, with no mount.

use redbfs::fs::{Caller, Fs};

/// Creates `name` in `parent` with `mode`, writes `data`, makes it durable with an fsync
/// when `durable` (else with the flush at close), closes it, and returns the create's lookup
/// reference as the kernel does when it evicts the inode. The new inode's number.
pub fn write_file(
    fs: &Fs,
    who: Caller,
    parent: u64,
    name: &str,
    mode: u32,
    data: &[u8],
    durable: bool,
) -> u64 {
    let (inode, fh) = fs
        .create(who, parent, name.as_bytes(), mode, 0, libc::O_WRONLY)
        .unwrap();
    fs.write(who, fh, 0, data).unwrap();
    if durable {
        fs.fsync(fh).unwrap();
    } else {
        fs.flush(fh).unwrap();
    }
    fs.release(fh).unwrap();
    fs.forget(inode.ino, 1);
    inode.ino
}
