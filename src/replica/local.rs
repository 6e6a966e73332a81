//! Reading a `file://` replica: what a directory holds and an object's bytes, never through a
//! symlink below the replica's root, and never blocking on what is not a regular file (a FIFO
//! or a device planted under an object's name opens non-blocking and is refused by `fstat`).
//! Each call is plain blocking I/O, run by `Target` on the runtime's blocking threads under a
//! timeout (a hung NFS share can still hold the thread; nothing ever waits for it).
//!
//! Invariant kept here: every byte returned was read from a regular file reached below the
//! root without following a symlink, and no read is larger than the size the caller allows.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};

/// What a directory entry is, as `lstat` says (a symlink is `Other`, never what it points to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Other,
}

/// One entry of a directory: its raw name, its kind and its size.
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
    pub size: u64,
}

fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Dir,
        SFlag::S_IFREG => Kind::File,
        _ => Kind::Other,
    }
}

fn nix_io(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// An open refused by `O_NOFOLLOW` (a symlink in the path) is `InvalidData`: the replica
/// holds what no shipper writes.
fn refused(e: nix::Error) -> io::Error {
    match e {
        nix::Error::ELOOP | nix::Error::ENOTDIR => io::Error::new(
            io::ErrorKind::InvalidData,
            "is a symbolic link (or not a directory), which a replica never holds",
        ),
        e => nix_io(e),
    }
}

/// The directory `parts` below `root` (the root itself may be a symlink: its owner chose it).
fn open_dir(root: &Path, parts: &[String]) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let mut dir = openat(nix::fcntl::AT_FDCWD, root, flags, Mode::empty()).map_err(nix_io)?;
    for part in parts {
        dir = openat(
            dir.as_fd(),
            part.as_str(),
            flags | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(refused)?;
    }
    Ok(dir)
}

/// The entries of directory `parts` below `root`; an empty list when it does not exist.
pub fn list(root: &Path, parts: &[String]) -> io::Result<Vec<Entry>> {
    let fd = match open_dir(root, parts) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(nix_io)?;
    let mut out = Vec::new();
    let dirfd = dir.as_fd().try_clone_to_owned()?;
    for e in dir.iter() {
        let e = e.map_err(nix_io)?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let st = match fstatat(
            dirfd.as_fd(),
            e.file_name(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            // Removed meanwhile.
            Err(nix::Error::ENOENT) => continue,
            Err(e) => return Err(nix_io(e)),
        };
        out.push(Entry {
            name: OsString::from_vec(name.to_vec()),
            kind: kind_of(&st),
            size: st.st_size.max(0) as u64,
        });
    }
    Ok(out)
}

/// Opens the object `parts` below `root` for reading: a regular file, no symlink followed,
/// never blocking on a FIFO; with its size.
pub fn open(root: &Path, parts: &[String]) -> io::Result<(File, u64)> {
    let (name, dirs) = parts
        .split_last()
        .ok_or_else(|| io::Error::other("no object name"))?;
    let dir = open_dir(root, dirs)?;
    let fd = openat(
        dir.as_fd(),
        name.as_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(refused)?;
    let st = fstat(fd.as_fd()).map_err(nix_io)?;
    if kind_of(&st) != Kind::File {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "is not a regular file, which a replica never holds",
        ));
    }
    Ok((File::from(fd), st.st_size.max(0) as u64))
}

/// Reads `len` bytes of `file` from `offset`; fewer only at its end.
pub fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}
