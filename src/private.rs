//! Files redbfs creates on the host: private from the first byte and never reached through a
//! symlink. Every file it makes (the store, its write-ahead log, the daemon's log and the file
//! it starts anew, the control socket, a snapshot and its temporary file, an export) is
//! created here with mode 0600 whatever the umask, with `O_NOFOLLOW`, and with `O_EXCL` where
//! it must be new; a store is kept only in a directory no other user can plant a file in (see
//! `check_store_dir`).
//! The one kind of file meant for others, a page written into a directory (`redbfs man
//! --out-dir`), is mode 0644 and replaces what is at its name, never writing through it
//! (`publish`).
//!
//! Also here: `escape`, which makes a name from a hostile tree safe to show on a terminal.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of every file redbfs creates: the owner reads and writes; nobody else.
pub const PRIVATE_MODE: u32 = 0o600;

fn opts() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(PRIVATE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// The error of an open refused by `O_NOFOLLOW`, with the rule it enforces named.
pub fn describe(path: &Path, e: io::Error) -> String {
    if e.raw_os_error() == Some(libc::ELOOP) {
        format!(
            "{}: is a symbolic link; redbfs never follows a symlink at a file it keeps beside a \
             store (remove it)",
            path.display()
        )
    } else {
        format!("{}: {e}", path.display())
    }
}

/// Creates a new file (read and write) at `path`: mode 0600, refusing anything already there,
/// a symlink included.
pub fn create_new(path: &Path) -> io::Result<File> {
    opts().read(true).write(true).create_new(true).open(path)
}

/// Writes `bytes` as `dir/name`, mode 0644 whatever the umask: under a new temporary name made
/// relative to `dir`'s descriptor (`O_EXCL|O_NOFOLLOW`), then renamed over `name`. A symlink
/// or hard link planted at `name` is replaced, never followed or written through; a reader
/// finds the old page or the new one, whole.
pub fn publish(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    use nix::fcntl::{OFlag, open, openat, renameat};
    use nix::sys::stat::Mode;
    use std::io::Write;
    let shown = |e: &dyn std::fmt::Display| format!("{}: {e}", dir.join(name).display());
    let dirfd = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = format!(".{name}.tmp-{}", std::process::id());
    let fd = openat(
        &dirfd,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| shown(&e))?;
    let mut f = File::from(fd);
    let written = f
        .write_all(bytes)
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| shown(&e))
        .and_then(|()| renameat(&dirfd, tmp.as_str(), &dirfd, name).map_err(|e| shown(&e)));
    if written.is_err() {
        let _ = nix::unistd::unlinkat(
            &dirfd,
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    written
}

/// Creates the output file of a tool (`export --tar FILE`): new, mode 0600, never through a
/// symlink. Something already at `path` is refused unless `force`, which removes it first (a
/// symlink itself, not what it points to; never a directory).
pub fn create_output(path: &Path, force: bool) -> Result<File, String> {
    if force {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => return Err(format!("{}: is a directory", path.display())),
            Ok(_) => std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(_) => {}
        }
    }
    create_new(path).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => format!(
            "{}: already exists; redbfs writes a new file and never follows a symlink there \
             (--force replaces it)",
            path.display()
        ),
        _ => format!("{}: {e}", path.display()),
    })
}

/// Opens the regular file at `path` for reading and writing, creating it (mode 0600) when
/// missing; never follows a symlink at `path`. An existing file left with group or other
/// permissions by an older release is made private.
pub fn open_or_create(path: &Path) -> io::Result<File> {
    let f = opts().read(true).write(true).create(true).open(path)?;
    make_private(&f)?;
    Ok(f)
}

/// Opens `path` for appending, creating it (mode 0600) when missing; never follows a symlink
/// at `path`. An existing file keeps its mode: a log file given by the user is theirs.
pub fn open_append(path: &Path) -> io::Result<File> {
    let f = opts().append(true).create(true).open(path)?;
    regular(&f)?;
    Ok(f)
}

/// Creates a new file at `path` for appending: mode 0600, refusing anything already there, a
/// symlink included (the daemon's log, started anew when full).
pub fn create_new_append(path: &Path) -> io::Result<File> {
    opts().append(true).create_new(true).open(path)
}

/// Opens the existing regular file at `path` for reading; never follows a symlink.
pub fn open_read(path: &Path) -> io::Result<File> {
    let f = opts()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    regular(&f)?;
    Ok(f)
}

fn regular(f: &File) -> io::Result<()> {
    if f.metadata()?.is_file() {
        Ok(())
    } else {
        Err(io::Error::other("not a regular file"))
    }
}

fn make_private(f: &File) -> io::Result<()> {
    let md = f.metadata()?;
    if !md.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if md.mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(PRIVATE_MODE))?;
    }
    Ok(())
}

/// The directory that holds `path` (`.` for a bare name).
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Refuses a store (or snapshot) whose directory another user may create files in: writable
/// by others, or by a group other than the owner's private one, without the sticky bit. There
/// another user could plant a symlink or a file at `STORE.wal`, `STORE.log` or `STORE.sock`
/// between two of our calls, or rename the store itself away.
pub fn check_store_dir(store: &Path) -> Result<(), String> {
    let dir = parent_dir(store);
    let md = match std::fs::metadata(&dir) {
        Ok(md) => md,
        // A missing directory is created by the caller, by its own user.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mode = md.mode();
    if mode & libc::S_ISVTX != 0 {
        return Ok(());
    }
    let by_others = mode & 0o002 != 0;
    let by_group = mode & 0o020 != 0 && !private_group(md.gid(), md.uid());
    if by_others || by_group {
        return Err(format!(
            "{}: the store's directory is writable by {} without the sticky bit; redbfs keeps \
             no store there, since another user could plant a symlink at its log or write-ahead \
             log (use a private directory, or `chmod go-w` it)",
            dir.display(),
            if by_others { "others" } else { "group" },
        ));
    }
    Ok(())
}

/// Whether `gid` is the private group of the user `uid` (the group named after the user,
/// whose primary group it is, with no other members), as Debian's user-private groups are: a
/// directory writable by that group is writable by its owner only.
fn private_group(gid: u32, uid: u32) -> bool {
    use nix::unistd::{Gid, Group, Uid, User};
    let (Ok(Some(user)), Ok(Some(group))) = (
        User::from_uid(Uid::from_raw(uid)),
        Group::from_gid(Gid::from_raw(gid)),
    ) else {
        return false;
    };
    user.gid.as_raw() == gid && group.mem.iter().all(|m| *m == user.name)
}

/// A name or path from outside (a tree being imported) made safe to print: control characters
/// as `\xNN`, invisible format characters and line separators as `\u{...}`, bytes that are
/// not UTF-8 as `\xNN`, and a backslash as `\\`, so a name cannot move the cursor, recolour
/// the terminal or reorder the text after it.
pub fn escape(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c => push_shown(&mut out, c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Text printed on a terminal (a process name, a message that may quote what `escape` already
/// made safe): control and invisible characters escaped as by `escape`, a backslash left as it
/// is, so escaping twice changes nothing.
pub fn escape_controls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_shown(&mut out, c);
    }
    out
}

fn push_shown(out: &mut String, c: char) {
    match c {
        c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if invisible(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// C1 controls, format characters (Unicode category Cf), line and paragraph separators, and
/// the fillers that show as blank.
fn invisible(c: char) -> bool {
    matches!(c as u32,
        0x80..=0x9F | 0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891
        | 0x08E2 | 0x115F | 0x1160 | 0x180E | 0x200B..=0x200F | 0x2028..=0x202E
        | 0x2060..=0x2064 | 0x2066..=0x206F | 0x2800 | 0x3164 | 0xFEFF | 0xFFA0
        | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_shows_what_a_terminal_would_act_on() {
        assert_eq!(
            escape("plain caf\u{e9}.md".as_bytes()),
            "plain caf\u{e9}.md"
        );
        assert_eq!(escape("rtl\u{202e}dm.exe".as_bytes()), "rtl\\u{202e}dm.exe");
        assert_eq!(escape(b"\x1b[31mred"), "\\x1b[31mred");
        assert_eq!(escape(b"a\nb\\c"), "a\\x0ab\\\\c");
        assert_eq!(escape(b"bad\xffbyte"), "bad\\xffbyte");
        assert_eq!(escape("\u{2028}\u{9b}".as_bytes()), "\\u{2028}\\u{9b}");
        let once = escape_controls("a\\b\x1b]0;X\x07\u{202e}");
        assert_eq!(once, "a\\b\\x1b]0;X\\x07\\u{202e}");
        assert_eq!(escape_controls(&once), once);
    }

    #[test]
    fn new_files_are_private_whatever_the_umask_and_symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let f = dir.path().join("f");
        let made = create_new(&f);
        nix::sys::stat::umask(old);
        made.unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        for r in [
            open_or_create(&link),
            open_append(&link),
            open_read(&link),
            create_new(&link),
        ] {
            assert!(r.is_err());
        }
        let e = open_append(&link).unwrap_err();
        assert!(describe(&link, e).contains("never follows a symlink"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }
}
