//! Helpers for tests that drive `Fs` directly over a store, with no mount.

use std::collections::BTreeMap;

use std::path::Path;

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

/// Creates `name` in the root as `who`, writes `data`, fsyncs and closes it, and returns the
/// create's lookup reference: the first error of the create, write or fsync, for tests whose
/// writes may fail.
pub fn try_write_file(fs: &Fs, who: Caller, name: &str, data: &[u8]) -> redbfs::fs::Result<()> {
    let (inode, fh) = fs.create(
        who,
        redbfs::store::ROOT_INO,
        name.as_bytes(),
        0o600,
        0,
        libc::O_WRONLY,
    )?;
    let written = fs.write(who, fh, 0, data).and_then(|_| fs.fsync(fh));
    let _ = fs.release(fh);
    fs.forget(inode.ino, 1);
    written
}

/// The root directory's entries by name: a file's content, or `<dir>` for a directory.
pub fn root_files(fs: &Fs, who: Caller) -> BTreeMap<String, Vec<u8>> {
    let fh = fs.opendir(redbfs::store::ROOT_INO).unwrap();
    let entries = fs.readdir(fh, 0).unwrap();
    fs.releasedir(fh).unwrap();
    entries
        .iter()
        .filter(|e| !redbfs::fs::is_dot(&e.name))
        .map(|e| {
            let data = if e.kind == redbfs::store::Kind::Dir {
                b"<dir>".to_vec()
            } else {
                let fh = fs.open(who, e.ino, Default::default()).unwrap();
                let data = fs.read(fh, 0, u32::MAX).unwrap();
                fs.release(fh).unwrap();
                data
            };
            (e.name.clone(), data)
        })
        .collect()
}

/// What a crash at this moment leaves of the open store `from`: its file and its
/// write-ahead log, copied to `to` while the store is open (a killed process leaves the page
/// cache behind, and the copy reads just that). Opening `to` replays the log.
pub fn crash_copy(from: &Path, to: &Path) {
    let wal = redbfs::store::wal::path_of;
    std::fs::copy(from, to).unwrap();
    std::fs::copy(wal(from), wal(to)).unwrap();
}
