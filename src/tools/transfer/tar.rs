//! Tar archives, through the `tar` crate: `export --tar` writes a POSIX (pax) archive whose
//! every entry carries its exact UTF-8 path and nanosecond mtime; `import --tar` stages an
//! archive's files and directories under the same rules and limits as a directory import.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, fstat};
use tar::{Archive, Builder, Entry, EntryType, Header};

use super::super::common::{EntryInfo, Result, err, lookup_path, read_content, tree};
use super::export::ExportReport;
use super::staging::{
    ImportReport, Importer, SPECIAL, SYMLINK, Staged, Staging, Target, admit, commit, file_cap,
    target, time_ns,
};
use crate::fs::Limits;
use crate::store::{Kind, ReadTxn, Store, now_ns};

/// `export --tar`: the tree under `path` as a POSIX (pax) tar stream with modes, owners and
/// mtimes (setuid and setgid bits are recorded; what unpacks them decides).
pub fn export_tar(r: &ReadTxn, path: &str, out: &mut dyn Write) -> Result<ExportReport> {
    let entries = tree(r, path)?;
    let base = entries[0].1.path.clone();
    let mut report = ExportReport::default();
    let mut ar = Builder::new(out);
    for (depth, e) in &entries {
        if *depth == 0 && e.kind == "dir" {
            continue;
        }
        let rel = e.path[base.len()..].trim_start_matches('/');
        let rel = if rel.is_empty() {
            e.name.clone()
        } else {
            rel.to_string()
        };
        if e.kind == "dir" {
            append(&mut ar, &format!("{rel}/"), e, &[]).map_err(err)?;
            report.dirs += 1;
        } else {
            let (inode, _) = lookup_path(r, &e.path)?;
            let data = read_content(r, &inode)?;
            append(&mut ar, &rel, e, &data).map_err(err)?;
            report.files += 1;
            report.bytes += data.len() as u64;
        }
    }
    // Two zero blocks end the archive.
    ar.into_inner().and_then(|out| out.flush()).map_err(err)?;
    Ok(report)
}

/// One pax record: "<len> <key>=<value>\n", where len counts the whole record.
fn pax_record(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}")
}

/// A ustar header; `name` is cut to the 100 bytes the field holds (the pax path is exact).
fn header(
    name: &[u8],
    kind: EntryType,
    size: u64,
    mtime: u64,
    (mode, uid, gid): (u32, u32, u32),
) -> Header {
    let mut h = Header::new_ustar();
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
    h.set_entry_type(kind);
    h.set_mode(mode & 0o7777);
    h.set_uid(u64::from(uid));
    h.set_gid(u64::from(gid));
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_cksum();
    h
}

/// Writes one entry: a pax header with its path and mtime, then the ustar header (its name
/// ASCII only) and the content.
fn append(
    ar: &mut Builder<&mut dyn Write>,
    path: &str,
    e: &EntryInfo,
    data: &[u8],
) -> io::Result<()> {
    let secs = e.mtime_ns.div_euclid(1_000_000_000);
    let nanos = e.mtime_ns.rem_euclid(1_000_000_000);
    let pax = format!(
        "{}{}",
        pax_record("path", path),
        pax_record("mtime", &format!("{secs}.{nanos:09}"))
    );
    let mtime = secs.max(0) as u64;
    let x = header(
        b"././@PaxHeader",
        EntryType::XHeader,
        pax.len() as u64,
        mtime,
        (0o644, 0, 0),
    );
    ar.append(&x, pax.as_bytes())?;
    let kind = if e.kind == "dir" {
        EntryType::Directory
    } else {
        EntryType::Regular
    };
    let ascii: Vec<u8> = path
        .bytes()
        .map(|b| if b.is_ascii() { b } else { b'_' })
        .collect();
    let h = header(
        &ascii,
        kind,
        data.len() as u64,
        mtime,
        (e.mode, e.uid, e.gid),
    );
    ar.append(&h, data)
}

const HARD_LINK: &str = "hard link: only regular files and directories exist in a store";
const BELOW_SKIPPED: &str = "below an entry that was skipped";
const OUTSIDE: &str = "an archive's entries go below the target only";

/// `import --tar`: copies the files and directories of the tar archive `tar` into the store
/// below `into` in one transaction, as `import` does a directory: the same staging, name rules,
/// limits and skip list. Symlinks, hard links, devices and FIFOs in the archive are listed and
/// skipped, and so are absolute paths and paths with `..` (nothing lands outside `into`), and
/// whatever an archive puts below a skipped entry. Directories the archive implies but does
/// not hold are made 0700. Run as root, entries keep their recorded owners and modes;
/// otherwise the importing user owns them and setuid and setgid bits are dropped.
pub fn import_tar(
    store: &Store,
    limits: &Limits,
    tar: &Path,
    into: &str,
    strict: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<ImportReport> {
    let target = target(store, into)?;
    let file = open_archive(tar)?;
    extensions_bounded(&file)
        .map_err(|e| format!("{}: {e}", shown(tar.as_os_str().as_encoded_bytes())))?;
    let mut report = ImportReport::default();
    let mut archive = Archive::new(BufReader::new(file));
    let bad = |e: io::Error| format!("{}: {e}", shown(tar.as_os_str().as_encoded_bytes()));
    let mut stage = ArchiveStage::new(limits, &target);
    for entry in archive.entries().map_err(bad)? {
        stage.entry(&mut entry.map_err(bad)?, &mut report)?;
        progress(stage.staged.len() as u64);
    }
    let staged = (stage.staged, stage.staging);
    commit(store, limits, &staged, &target, strict, &mut report)?;
    Ok(report)
}

/// A path of the archive as the skip list shows it: its first `SHOWN_MAX` bytes.
fn shown(raw: &[u8]) -> String {
    match raw.get(..SHOWN_MAX) {
        Some(head) if raw.len() > SHOWN_MAX => {
            format!("{}... ({} bytes)", crate::private::escape(head), raw.len())
        }
        _ => crate::private::escape(raw),
    }
}

/// The most of a path the skip list shows: far more than any path the limits let in.
const SHOWN_MAX: usize = 4096;

/// The most bytes a GNU long name or long link, or a pax header, may hold: far more than any
/// path the limits let in (`--max-path-bytes`), and little enough to hold in memory.
const EXTENSION_MAX: u64 = 64 * 1024;

/// Refuses an archive holding a GNU long name or long link, or a pax header, larger than
/// `EXTENSION_MAX`: the `tar` crate reads each of those whole into memory, so the size an
/// archive states would decide an allocation. Walks the headers once, reading nothing but
/// them and the pax headers (each within the bound), and follows what moves the next header
/// as the crate does: a pax `size` record and a GNU sparse header's extension blocks. Stops
/// quietly at the end, at a header whose checksum fails or at a cut-short archive, where the
/// crate's own reading reports the damage.
fn extensions_bounded(file: &std::fs::File) -> std::result::Result<(), String> {
    use std::os::unix::fs::FileExt;
    const BLOCK: u64 = 512;
    let read_at = |buf: &mut [u8], at: u64| match file.read_exact_at(buf, at) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e.to_string()),
    };
    let mut at = 0u64;
    let mut pax_size = None;
    let mut block = [0u8; BLOCK as usize];
    while read_at(&mut block, at)? && block.iter().any(|&b| b != 0) {
        let h = Header::from_byte_slice(&block);
        let sum: u32 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(b)
                }
            })
            .sum();
        let Ok(size) = h.entry_size() else {
            return Ok(());
        };
        if h.cksum().ok() != Some(sum) {
            return Ok(());
        }
        let kind = h.entry_type();
        let extension = kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions();
        let size = if extension {
            if size > EXTENSION_MAX {
                let what = if kind.is_gnu_longname() || kind.is_gnu_longlink() {
                    "a long name"
                } else {
                    "a pax header"
                };
                return Err(format!(
                    "{what} of {size} bytes at byte {at}, over the {EXTENSION_MAX} an import reads"
                ));
            }
            size
        } else {
            pax_size.take().unwrap_or(size)
        };
        at += BLOCK;
        if kind.is_pax_local_extensions() {
            let mut data = vec![0u8; size as usize];
            if !read_at(&mut data, at)? {
                return Ok(());
            }
            for x in tar::PaxExtensions::new(&data).flatten() {
                if x.key() == Ok("size") {
                    pax_size = x.value().ok().and_then(|v| v.parse::<u64>().ok());
                }
            }
        }
        if kind.is_gnu_sparse() && h.as_gnu().is_some_and(|g| g.is_extended()) {
            // Extension blocks of the sparse map follow the header, each saying if another does.
            loop {
                if !read_at(&mut block, at)? {
                    return Ok(());
                }
                at += BLOCK;
                if block[504] == 0 {
                    break;
                }
            }
        }
        let Some(next) = size
            .checked_next_multiple_of(BLOCK)
            .and_then(|n| at.checked_add(n))
        else {
            return Ok(());
        };
        at = next;
    }
    Ok(())
}

/// Opens the archive: the caller's own argument (it may be reached through a symlink), a
/// regular file, never a FIFO or a device waited on.
fn open_archive(tar: &Path) -> Result<std::fs::File> {
    let name = || shown(tar.as_os_str().as_encoded_bytes());
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::open(tar, flags, Mode::empty()).map_err(|e| format!("{}: {e}", name()))?;
    let st = fstat(&fd).map_err(|e| format!("{}: {e}", name()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{}: not a regular file (a tar archive)", name()));
    }
    Ok(std::fs::File::from(fd))
}

/// The components of an archive's path below the target: `.` and empty ones dropped; an
/// absolute path or a `..` has no place.
fn components(raw: &[u8]) -> std::result::Result<Vec<&[u8]>, String> {
    if raw.starts_with(b"/") {
        return Err(format!("absolute path: {OUTSIDE}"));
    }
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(format!("\"..\" in the path: {OUTSIDE}")),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A pax time (`secs[.fraction]`) in nanoseconds.
fn pax_time(v: &str) -> Option<i64> {
    let (s, f) = v.split_once('.').unwrap_or((v, ""));
    let secs: i64 = s.parse().ok()?;
    let digits: String = f.chars().take(9).collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let nanos: i64 = format!("{digits:0<9}").parse().ok()?;
    let ns = secs.checked_mul(1_000_000_000)?;
    if s.starts_with('-') {
        ns.checked_sub(nanos)
    } else {
        ns.checked_add(nanos)
    }
}

/// The archive's entries staged so far, by their path below the target (normalised names).
struct ArchiveStage<'a> {
    limits: &'a Limits,
    /// The target's depth and path bytes in the store.
    base: (usize, usize),
    staged: Vec<Staged>,
    staging: Staging,
    index: HashMap<Vec<String>, usize>,
    /// Paths skipped for what they are: nothing goes below them.
    refused: HashSet<Vec<String>>,
    /// The importing user, who owns what the archive implies and, unless root, everything.
    who: Importer,
    now: i64,
}

impl<'a> ArchiveStage<'a> {
    fn new(limits: &'a Limits, target: &Target) -> ArchiveStage<'a> {
        ArchiveStage {
            limits,
            base: (target.depth, target.bytes),
            staged: Vec::new(),
            staging: Staging::default(),
            index: HashMap::new(),
            refused: HashSet::new(),
            who: Importer::current(),
            now: now_ns(),
        }
    }

    /// Entries staged or remembered as refused: what staging's memory holds one of each of.
    fn held(&self) -> usize {
        self.staged.len() + self.refused.len()
    }

    /// The store names of an archive path, each passing the name rules and limits.
    fn names(&self, raw: &[u8]) -> std::result::Result<Vec<String>, String> {
        let mut names = Vec::new();
        let mut bytes = self.base.1;
        for (i, part) in components(raw)?.into_iter().enumerate() {
            let name = admit(self.limits, part, self.base.0 + i + 1, bytes)?;
            bytes += 1 + name.as_str().len();
            names.push(name.as_str().to_string());
        }
        Ok(names)
    }

    /// Stages one entry of the archive, or lists it as skipped.
    fn entry<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        report: &mut ImportReport,
    ) -> Result<()> {
        if entry.header().entry_type() == EntryType::XGlobalHeader {
            return Ok(()); // pax defaults for the entries after it, not an entry
        }
        let raw = entry.path_bytes().into_owned();
        let path = shown(&raw);
        let names = match self.names(&raw) {
            Ok(n) if n.is_empty() => return Ok(()), // `./`: the target itself
            Ok(n) => n,
            Err(why) => {
                report.skip(path, why);
                return Ok(());
            }
        };
        if (1..names.len()).any(|n| self.refused.contains(&names[..n])) {
            report.skip(path, BELOW_SKIPPED);
            return Ok(());
        }
        let kind = match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => Kind::File,
            EntryType::Directory => Kind::Dir,
            other => {
                let why = match other {
                    EntryType::Symlink => SYMLINK.to_string(),
                    EntryType::Link => HARD_LINK.to_string(),
                    EntryType::Char | EntryType::Block | EntryType::Fifo => SPECIAL.to_string(),
                    other => format!("tar entry of type {:?}: not a file or directory", other),
                };
                // Remembered while staging has room: once it has none, nothing new is
                // staged, below this entry or anywhere.
                if self
                    .staging
                    .refuse(self.limits, self.held() + 1, 0)
                    .is_none()
                {
                    self.refused.insert(names);
                }
                report.skip(path, why);
                return Ok(());
            }
        };
        // What it would stage: the directories it implies that are not staged yet, itself
        // unless it names again a directory staged already, and its content.
        let slots = (1..=names.len())
            .filter(|&n| !self.index.contains_key(&names[..n]))
            .count();
        let size = match kind {
            Kind::File if entry.size() <= file_cap(self.limits).0 => entry.size(),
            _ => 0, // a file over the cap is skipped as such when read
        };
        if let Some(why) = self.staging.refuse(self.limits, self.held() + slots, size) {
            report.skip(path, why);
            return Ok(());
        }
        let Some(parent) = self.parents(&names, &path, report) else {
            return Ok(());
        };
        let Some(mut staged) = self.read(entry, kind, &path, report)? else {
            return Ok(());
        };
        staged.parent = parent;
        staged.name = names.last().expect("not empty").clone();
        match self.index.get(&names) {
            // A directory the archive implied earlier, or names again: it takes this entry's
            // mode, owner and times.
            Some(&i) if kind == Kind::Dir && self.staged[i].kind == Kind::Dir => {
                self.staged[i] = Staged {
                    parent: self.staged[i].parent,
                    ..staged
                };
            }
            Some(_) => report.skip(path, "appears twice in the archive"),
            None => {
                self.staged.push(staged);
                self.index.insert(names, self.staged.len() - 1);
            }
        }
        Ok(())
    }

    /// The staged index of the parent of `names` (None: the target), staging the directories
    /// the archive implies; None when a parent is a file of the archive (listed as skipped).
    fn parents(
        &mut self,
        names: &[String],
        path: &str,
        report: &mut ImportReport,
    ) -> Option<Option<usize>> {
        let mut parent = None;
        for n in 1..names.len() {
            parent = Some(match self.index.get(&names[..n]) {
                Some(&i) if self.staged[i].kind == Kind::Dir => i,
                Some(_) => {
                    report.skip(path.to_string(), "below a file of the archive");
                    return None;
                }
                None => {
                    let implied = Staged {
                        parent,
                        name: names[n - 1].clone(),
                        path: shown(names[..n].join("/").as_bytes()),
                        kind: Kind::Dir,
                        perm: 0o700,
                        uid: self.who.me().0,
                        gid: self.who.me().1,
                        atime: self.now,
                        mtime: self.now,
                        content: (0, 0),
                    };
                    self.staged.push(implied);
                    self.index
                        .insert(names[..n].to_vec(), self.staged.len() - 1);
                    self.staged.len() - 1
                }
            });
        }
        Some(parent)
    }

    /// The entry's metadata and, for a file, its content staged; None when it is over
    /// `--max-file-bytes` (listed as skipped).
    fn read<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        kind: Kind,
        path: &str,
        report: &mut ImportReport,
    ) -> Result<Option<Staged>> {
        let bad = |e: io::Error| format!("{path}: {e}");
        let (max, over) = file_cap(self.limits);
        if kind == Kind::File && entry.size() > max {
            report.skip(path.to_string(), over);
            return Ok(None);
        }
        let h = entry.header();
        let mode = h.mode().map_err(bad)? & 0o7777;
        let id = |v: io::Result<u64>| -> Result<u32> {
            let v = v.map_err(bad)?;
            u32::try_from(v).map_err(|_| format!("{path}: owner id {v} is out of range"))
        };
        let (perm, uid, gid) = self.who.owns(mode, || Ok((id(h.uid())?, id(h.gid())?)))?;
        let secs = h.mtime().map_err(bad)?.min(i64::MAX as u64) as i64;
        let mut mtime = time_ns(secs, 0);
        for x in entry.pax_extensions().map_err(bad)?.into_iter().flatten() {
            let x = x.map_err(bad)?;
            if x.key() == Ok("mtime")
                && let Some(t) = x.value().ok().and_then(pax_time)
            {
                mtime = t;
            }
        }
        let mut staged = Staged {
            parent: None,
            name: String::new(),
            path: path.to_string(),
            kind,
            perm,
            uid,
            gid,
            atime: mtime,
            mtime,
            content: (0, 0),
        };
        if kind == Kind::File {
            // No further than the limit, whatever the header said.
            let mut data = Vec::new();
            entry
                .take(max.saturating_add(1))
                .read_to_end(&mut data)
                .map_err(bad)?;
            if data.len() as u64 > max {
                report.skip(path.to_string(), over);
                return Ok(None);
            }
            if let Some(why) = self.staging.over_quota(self.limits, data.len() as u64) {
                report.skip(path.to_string(), why);
                return Ok(None);
            }
            staged.content = self.staging.put(&data)?;
        }
        Ok(Some(staged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive of `entries` (type, header size, data) as a file.
    fn archive(entries: &[(EntryType, u64, Vec<u8>)]) -> tempfile::NamedTempFile {
        let mut b = Builder::new(Vec::new());
        for (i, (kind, size, data)) in entries.iter().enumerate() {
            let mut h = Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_path(format!("e{i}")).unwrap();
            h.set_size(*size);
            h.set_mode(0o644);
            h.set_cksum();
            // The header as it is, then the data, whatever the header's size says.
            b.get_mut().extend_from_slice(h.as_bytes());
            b.get_mut().extend_from_slice(data);
            let pad = data.len().next_multiple_of(512) - data.len();
            b.get_mut().extend(std::iter::repeat_n(0u8, pad));
        }
        let bytes = b.into_inner().unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        f
    }

    #[test]
    fn an_oversized_long_name_or_pax_header_refuses_the_archive_before_it_is_read() {
        let big = vec![b'a'; 1 << 20];
        let long = archive(&[(EntryType::GNULongName, 1 << 20, big.clone())]);
        let e = extensions_bounded(long.as_file()).unwrap_err();
        assert!(e.contains("a long name of 1048576 bytes"), "{e}");
        let pax = archive(&[(EntryType::XHeader, 1 << 20, big.clone())]);
        let e = extensions_bounded(pax.as_file()).unwrap_err();
        assert!(e.contains("a pax header of 1048576 bytes"), "{e}");

        // Within the bound, and an ordinary archive: nothing to refuse.
        let name = vec![b'n'; 300];
        let fine = archive(&[
            (EntryType::GNULongName, 300, name),
            (EntryType::Regular, 5, b"hello".to_vec()),
        ]);
        extensions_bounded(fine.as_file()).unwrap();

        // A pax size record moves the next header: the walk follows it to the long name
        // behind a file whose ustar size field says 0.
        let record = pax_record("size", "1024");
        let hidden = archive(&[
            (EntryType::XHeader, record.len() as u64, record.into_bytes()),
            (EntryType::Regular, 0, vec![b'x'; 1024]),
            (EntryType::GNULongName, 1 << 20, big),
        ]);
        let e = extensions_bounded(hidden.as_file()).unwrap_err();
        assert!(e.contains("a long name"), "{e}");
    }

    #[test]
    fn a_pax_time_out_of_range_is_no_time() {
        assert_eq!(pax_time("9223372036.999999999"), None);
        assert_eq!(pax_time("-9223372037.5"), None);
        assert_eq!(pax_time("9223372036.5"), Some(9_223_372_036_500_000_000));
    }

    #[test]
    fn pax_record_length_counts_itself() {
        let r = pax_record("path", "a");
        assert_eq!(r, "9 path=a\n");
        assert_eq!(r.len(), 9);
        let long = pax_record("path", &"x".repeat(95));
        assert_eq!(
            long.len(),
            long.split(' ').next().unwrap().parse::<usize>().unwrap()
        );
    }

    #[test]
    fn paths_stay_below_the_target() {
        assert_eq!(components(b"./a//b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(components(b"/etc/passwd").is_err());
        assert!(components(b"a/../../evil").is_err());
        assert!(components(b"./").unwrap().is_empty());
    }

    #[test]
    fn pax_times() {
        assert_eq!(
            pax_time("1600000000.123456789"),
            Some(1_600_000_000_123_456_789)
        );
        assert_eq!(pax_time("5"), Some(5_000_000_000));
        assert_eq!(pax_time("1.5"), Some(1_500_000_000));
        assert_eq!(pax_time("x"), None);
    }
}
