//! rename and RENAME_EXCHANGE: one transaction each, whatever the size of a moved directory;
//! a replaced file goes the way of an unlink, and a replace may be a lost update.

use super::*;

/// One entry moving from `name` in `parent` to `new_name` in `new_parent`.
struct Move<'a> {
    parent: u64,
    name: &'a Name,
    new_parent: u64,
    new_name: &'a Name,
    src: u64,
    src_kind: Kind,
}

impl Fs {
    /// Whether `ino` is `dir` or lies below it.
    pub(super) fn is_within(w: &WriteTxn<'_>, ino: u64, dir: u64) -> Result<bool> {
        let mut cur = ino;
        loop {
            if cur == dir {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = w.inode(cur)?.ok_or(Error::NotFound)?.parent;
        }
    }

    /// What a plain rename (not an exchange) must pass before anything changes: no directory
    /// into its own subtree, the new entry and everything under a moved directory within the
    /// path limits, and a replaced entry of a kind it may replace.
    fn check_move(
        &self,
        w: &mut WriteTxn<'_>,
        m: &Move<'_>,
        dst: Option<(u64, Kind)>,
    ) -> Result<()> {
        if m.src_kind == Kind::Dir && Self::is_within(w, m.new_parent, m.src)? {
            return Err(Error::Invalid(
                "a directory cannot move into its own subtree",
            ));
        }
        self.check_new_entry(w, m.new_parent, m.new_name, Some(m.src))?;
        if m.src_kind == Kind::Dir {
            let old_cost = self.path_cost(w, m.parent, m.name.as_str())?;
            let new_cost = self.path_cost(w, m.new_parent, m.new_name.as_str())?;
            self.check_moved_subtree(w, m.src, old_cost, new_cost)?;
        }
        match dst {
            Some((d, dk)) => Self::check_replace(w, m.src_kind, d, dk),
            None => Ok(()),
        }
    }

    /// Replacing file `d` with this move: a lost update is noted on the rename's own record
    /// and the rename goes on (`record`; the conflict is returned, to be counted and logged
    /// once the rename commits, since a batch it joined may make it run again), or the
    /// transaction is given up and the refusal gets a record of its own (`refuse`).
    fn check_lost_update<'s>(
        &'s self,
        caller: Caller,
        mut w: WriteTxn<'s>,
        m: &Move<'_>,
        d: u64,
    ) -> Result<(WriteTxn<'s>, Option<Conflict>)> {
        let name = m.new_name.as_str();
        let Some(c) = self.tracker.check(caller.pid, d, m.new_parent, name) else {
            return Ok((w, None));
        };
        if self.tracker.mode() == LostUpdates::Refuse {
            drop(w);
            // The refusal rests on what the tracker saw, not on what a batch this write
            // joined wrote: it stands, and is not run again (`Fs::joinable`).
            Store::take_abandoned();
            self.lost_update(caller, "rename", m.new_parent, name, &c)?;
            return Err(Error::LostUpdate {
                maker: c.maker_pid(),
            });
        }
        w.note_conflict(Self::conflict_note(&c, false));
        Ok((w, Some(c)))
    }

    /// Whether `dst` (of kind `dk`) may be replaced by a `src_kind`: a file by a file, an
    /// empty directory by a directory.
    fn check_replace(w: &WriteTxn<'_>, src_kind: Kind, dst: u64, dk: Kind) -> Result<()> {
        match (src_kind, dk) {
            (Kind::Dir, Kind::File) => Err(Error::NotDir),
            (Kind::File, Kind::Dir) => Err(Error::IsDir),
            (Kind::Dir, Kind::Dir) if !w.list(dst, 1)?.is_empty() => Err(Error::NotEmpty),
            _ => Ok(()),
        }
    }

    /// Moves the entry in `w`: its dirent, its record's parent and name, and the two parents'
    /// times and link counts.
    fn stage_move(w: &mut WriteTxn<'_>, m: &Move<'_>) -> Result<()> {
        let now = now_ns();
        w.remove_dirent(m.parent, m.name.as_str())?;
        w.put_dirent(m.new_parent, m.new_name.as_str(), m.src, m.src_kind)?;
        let mut s = w.inode(m.src)?.ok_or(Error::NotFound)?;
        s.parent = m.new_parent;
        s.name = m.new_name.as_str().to_string();
        s.ctime = now;
        w.put_inode(&s)?;
        let mut p = w.inode(m.parent)?.ok_or(Error::NotFound)?;
        p.mtime = now;
        p.ctime = now;
        if m.parent == m.new_parent {
            return Ok(w.put_inode(&p)?);
        }
        let dir = m.src_kind == Kind::Dir;
        if dir {
            p.nlink -= 1;
        }
        w.put_inode(&p)?;
        let mut np = w.inode(m.new_parent)?.ok_or(Error::NotFound)?;
        if dir {
            np.nlink += 1;
        }
        np.mtime = now;
        np.ctime = now;
        Ok(w.put_inode(&np)?)
    }

    pub fn rename(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        new_parent: u64,
        raw_new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.writable()?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return Err(Error::Invalid("unsupported rename flags"));
        }
        let name = self.parse_name(raw_name)?;
        let new_name = self.parse_name(raw_new_name)?;
        self.joinable(|join| {
            let mut w = self.write_for(join, caller.pid, None)?;
            Self::parent_dir(&w, parent)?;
            Self::parent_dir(&w, new_parent)?;
            let (src, src_kind) = w.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
            let dst = w.lookup(new_parent, new_name.as_str())?;
            let size = w.inode(src)?.map_or(0, |i| i.size);
            let op = if exchange { "exchange" } else { "rename" };
            self.describe(
                &mut w,
                caller,
                op,
                src,
                |w| {
                    vec![
                        self.path_in(w, parent, name.as_str()),
                        self.path_in(w, new_parent, new_name.as_str()),
                    ]
                },
                size,
                size,
            );
            if exchange {
                let (dst, dst_kind) = dst.ok_or(Error::NotFound)?;
                return self.exchange(
                    w,
                    (parent, &name, src, src_kind),
                    (new_parent, &new_name, dst, dst_kind),
                );
            }
            if dst.is_some() && noreplace {
                return Err(Error::Exists);
            }
            if dst.is_some_and(|(d, _)| d == src) {
                return Ok(());
            }
            let mv = Move {
                parent,
                name: &name,
                new_parent,
                new_name: &new_name,
                src,
                src_kind,
            };
            self.check_move(&mut w, &mv, dst)?;
            let mut removal = None;
            let mut conflict = None;
            if let Some((d, _)) = dst {
                if src_kind == Kind::File {
                    (w, conflict) = self.check_lost_update(caller, w, &mv, d)?;
                }
                removal = Some((d, self.claim_removal(d)));
            }
            let staged = (|| -> Result<()> {
                if let Some((d, dk)) = dst {
                    if let Some((_, r)) = &removal {
                        Self::stage_removal(&mut w, d, r)?;
                    }
                    if dk == Kind::Dir {
                        let mut np = w.inode(new_parent)?.ok_or(Error::NotFound)?;
                        np.nlink -= 1;
                        w.put_inode(&np)?;
                    }
                }
                Self::stage_move(&mut w, &mv)
            })();
            let res = staged.and_then(|()| self.commit_numbered(w, Sync::Durable));
            if let Some((d, r)) = removal {
                self.finish_removal(d, r, res.as_ref().ok().copied());
            }
            let res = res.map(drop);
            if res.is_ok() && src_kind == Kind::File {
                if let Some(c) = &conflict {
                    self.report_lost_update("rename", new_parent, new_name.as_str(), c);
                }
                self.tracker
                    .renamed(caller.pid, src, new_parent, new_name.as_str());
            }
            res
        })
    }

    /// RENAME_EXCHANGE: both names swap inodes in one transaction.
    pub(super) fn exchange(
        &self,
        mut w: WriteTxn<'_>,
        a: (u64, &Name, u64, Kind),
        b: (u64, &Name, u64, Kind),
    ) -> Result<()> {
        let (pa, na, ia, ka) = a;
        let (pb, nb, ib, kb) = b;
        if ia == ib {
            return Ok(());
        }
        if (ka == Kind::Dir && Self::is_within(&w, pb, ia)?)
            || (kb == Kind::Dir && Self::is_within(&w, pa, ib)?)
        {
            return Err(Error::Invalid(
                "a directory cannot move into its own subtree",
            ));
        }
        // Each side takes the other's place: both must fit the path limits there.
        for (ino, kind, from, to) in [(ia, ka, (pa, na), (pb, nb)), (ib, kb, (pb, nb), (pa, na))] {
            let new_cost = self.path_cost(&w, to.0, to.1.as_str())?;
            self.check_path(new_cost.0, new_cost.1)?;
            if kind == Kind::Dir {
                let old_cost = self.path_cost(&w, from.0, from.1.as_str())?;
                self.check_moved_subtree(&mut w, ino, old_cost, new_cost)?;
            }
        }
        let now = now_ns();
        w.put_dirent(pa, na.as_str(), ib, kb)?;
        w.put_dirent(pb, nb.as_str(), ia, ka)?;
        for (ino, parent, name) in [(ia, pb, nb), (ib, pa, na)] {
            let mut i = w.inode(ino)?.ok_or(Error::NotFound)?;
            i.parent = parent;
            i.name = name.as_str().to_string();
            i.ctime = now;
            w.put_inode(&i)?;
        }
        let dirs = |k: Kind| i64::from(k == Kind::Dir);
        let shift = dirs(kb) - dirs(ka); // change of subdirectories under pa
        for (p, delta) in [(pa, shift), (pb, -shift)] {
            let mut pi = w.inode(p)?.ok_or(Error::NotFound)?;
            if pa != pb {
                pi.nlink = (pi.nlink as i64 + delta) as u32;
            }
            pi.mtime = now;
            pi.ctime = now;
            w.put_inode(&pi)?;
        }
        self.commit(w, Sync::Durable)
    }
}
