//! A transaction's redo: every key it put (with the value) and every key it removed, in
//! order, encoded for its write-ahead log record (see `wal`), and applied again by recovery.
//!
//! Entry: op (u8: 1 put, 2 remove), table name length (u8), table name, key length (u32),
//! key, and for a put value length (u32) and value; keys and values in redb's own byte
//! encoding of the table's types. Every write of `WriteTxn` records itself here, so a record
//! replays the transaction exactly, whatever operation made it.

use std::cell::RefCell;

use redb::TableDefinition;

use super::schema::*;
use super::{StoreError, map_err};

/// A transaction's redo as it is built, and the size past which it is given up (the
/// transaction then has no record: the log checkpoints it, and a replica's chain breaks).
pub(super) struct Redo {
    buf: RefCell<Option<Vec<u8>>>,
    limit: usize,
}

impl Redo {
    /// An empty redo that may grow to `limit` bytes.
    pub(super) fn new(limit: usize) -> Redo {
        Redo {
            buf: RefCell::new(Some(Vec::new())),
            limit,
        }
    }

    /// About to add `bytes` more: room for them at once, or the redo given up now when they
    /// would take it past the limit, so a transaction bound to be too large (a big file's
    /// content) copies nothing into it first.
    pub(super) fn expect(&self, bytes: usize) {
        let mut slot = self.buf.borrow_mut();
        if let Some(r) = slot.as_mut() {
            if r.len() + bytes > self.limit {
                *slot = None;
            } else {
                r.reserve(bytes);
            }
        }
    }

    /// The record, or None when the transaction outgrew the limit.
    pub(super) fn take(&self) -> Option<Vec<u8>> {
        self.buf.take()
    }
}

/// The byte form a table's keys or values must have (redb's encoding of the type; its
/// `from_bytes` panics on any other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// A fixed-width type (`u64`, `(u64, u64)`, `(u64, u8)`, `()`): exactly this many bytes.
    Fixed(usize),
    /// `&[u8]`: any bytes.
    Bytes,
    /// `&str`: UTF-8.
    Str,
    /// `(u64, &str)`: a u64, then UTF-8 to the end (redb gives the last element of a tuple no
    /// length).
    U64Str,
    /// `(&[u8], u64)`: redb's length of the first element (a varint: one byte below 254, or
    /// 254 and a u16, or 255 and a u32, little-endian), the bytes, then a u64.
    BytesU64,
    /// `(&str, u64)`: as `BytesU64`, with UTF-8 as the first element.
    StrU64,
}

/// The first element of a `(variable, u64)` tuple key: its bytes, when the length prefix and
/// the u64 after them account for exactly `b`.
fn leading_element(b: &[u8]) -> Option<&[u8]> {
    let (len, at): (usize, usize) = match *b.first()? {
        n @ 0..=253 => (usize::from(n), 1),
        254 => (
            usize::from(u16::from_le_bytes(b.get(1..3)?.try_into().ok()?)),
            3,
        ),
        255 => (
            usize::try_from(u32::from_le_bytes(b.get(1..5)?.try_into().ok()?)).ok()?,
            5,
        ),
    };
    let end = at.checked_add(len)?;
    (end.checked_add(8)? == b.len()).then(|| &b[at..end])
}

impl Form {
    fn admits(self, b: &[u8]) -> bool {
        match self {
            Form::Fixed(n) => b.len() == n,
            Form::Bytes => true,
            Form::Str => std::str::from_utf8(b).is_ok(),
            Form::U64Str => b.len() >= 8 && std::str::from_utf8(&b[8..]).is_ok(),
            Form::BytesU64 => leading_element(b).is_some(),
            Form::StrU64 => leading_element(b).is_some_and(|e| std::str::from_utf8(e).is_ok()),
        }
    }
}

/// Every table a record may name, with the form of its keys and of its values.
const TABLE_FORMS: [(&str, Form, Form); 18] = [
    ("meta", Form::Str, Form::Bytes),
    ("inodes", Form::Fixed(8), Form::Bytes),
    ("dirents", Form::U64Str, Form::Fixed(9)),
    ("filemap", Form::Fixed(16), Form::Fixed(8)),
    ("blobs", Form::Fixed(8), Form::Bytes),
    ("orphans", Form::Fixed(8), Form::Fixed(0)),
    ("blobrefs", Form::Fixed(8), Form::Fixed(8)),
    ("history", Form::Fixed(8), Form::Bytes),
    ("history_undo", Form::Fixed(12), Form::Bytes),
    ("marks", Form::Str, Form::Fixed(8)),
    ("redacted", Form::Fixed(8), Form::Fixed(0)),
    ("history_keys", Form::BytesU64, Form::Bytes),
    ("history_paths", Form::StrU64, Form::Fixed(0)),
    ("history_times", Form::Fixed(16), Form::Fixed(0)),
    ("subtree", Form::Fixed(8), Form::Bytes),
    ("quotas", Form::Fixed(8), Form::Fixed(0)),
    ("deltas", Form::Fixed(16), Form::Fixed(0)),
    ("blob_deltas", Form::Fixed(8), Form::Bytes),
];

/// Checks that a record decodes whole into entries redb can take: each a known operation on
/// a known table, with a key and a value of the byte form that table's types have. Replaying
/// a record that passes never panics in redb; one that fails is refused with the offset of the
/// entry at fault, within the record, and why.
pub fn check(payload: &[u8]) -> Result<(), (usize, String)> {
    let mut c = Cursor {
        bytes: payload,
        at: 0,
    };
    while c.at < payload.len() {
        let start = c.at;
        let cut = |what: &str| (start, format!("an entry is cut short in its {what}"));
        let op = c.take(1).ok_or_else(|| cut("operation"))?[0];
        if op != REDO_PUT && op != REDO_DEL {
            return Err((start, format!("unknown operation {op}")));
        }
        let name_len = c.take(1).ok_or_else(|| cut("table name"))?[0] as usize;
        let name = c.take(name_len).ok_or_else(|| cut("table name"))?;
        let table = String::from_utf8_lossy(name);
        let Some(&(_, key_form, value_form)) = TABLE_FORMS.iter().find(|t| t.0.as_bytes() == name)
        else {
            return Err((start, format!("unknown table {table:?}")));
        };
        let key = c.take_counted().ok_or_else(|| cut("key"))?;
        if !key_form.admits(key) {
            let n = key.len();
            return Err((
                start,
                format!("a key of {n} bytes does not fit table {table}"),
            ));
        }
        if op == REDO_PUT {
            let value = c.take_counted().ok_or_else(|| cut("value"))?;
            if !value_form.admits(value) {
                let n = value.len();
                return Err((
                    start,
                    format!("a value of {n} bytes does not fit table {table}"),
                ));
            }
            if let Some(v) = newer_format(name, key, value) {
                return Err((
                    start,
                    format!(
                        "it stamps store format {v}, but this redbfs reads version \
                         {FORMAT_VERSION}: its records come from a later release"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The store format a `meta` put stamps, when it is one this build does not know (a writer
/// of a later release migrating its store): its later records may hold forms this build
/// cannot read, so a replica's segment holding it is refused rather than applied.
fn newer_format(table: &[u8], key: &[u8], value: &[u8]) -> Option<u64> {
    if table != b"meta" || key != META_FORMAT.as_bytes() {
        return None;
    }
    let v = u64::from_le_bytes(value.try_into().ok()?);
    (v > u64::from(FORMAT_VERSION)).then_some(v)
}

/// Reads a record's entries from the front.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let got = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(got)
    }

    /// A u32 length, then that many bytes.
    fn take_counted(&mut self) -> Option<&'a [u8]> {
        let n = self.take(4)?;
        self.take(u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize)
    }
}

/// Applies one log record's changes to `tx`; a record that does not pass `check` is refused
/// before any of it is applied.
pub(super) fn replay(tx: &redb::WriteTransaction, payload: &[u8]) -> Result<(), StoreError> {
    replay_noting(tx, payload, &mut |_, _| {})
}

/// `replay`, telling `note` the table and key of every change it applies.
pub(super) fn replay_noting(
    tx: &redb::WriteTransaction,
    payload: &[u8],
    note: &mut dyn FnMut(&str, &[u8]),
) -> Result<(), StoreError> {
    check(payload).map_err(|(at, why)| {
        StoreError::Corrupt(format!(
            "a record of the log does not decode at byte {at}: {why}"
        ))
    })?;
    let bad = || StoreError::Corrupt("a record of the log does not decode".into());
    let mut rest = payload;
    let mut take = |n: usize| -> Result<&[u8], StoreError> {
        if rest.len() < n {
            return Err(bad());
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    while let Ok(op) = take(1) {
        let op = op[0];
        let name_len = take(1)?[0] as usize;
        let name = std::str::from_utf8(take(name_len)?)
            .map_err(|_| bad())?
            .to_string();
        let key_len = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
        let key = take(key_len)?.to_vec();
        let value = match op {
            REDO_PUT => {
                let n = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
                Some(take(n)?.to_vec())
            }
            REDO_DEL => None,
            _ => return Err(bad()),
        };
        let v = value.as_deref();
        match name.as_str() {
            "meta" => apply(tx, META, &key, v),
            "inodes" => apply(tx, INODES, &key, v),
            "dirents" => apply(tx, DIRENTS, &key, v),
            "filemap" => apply(tx, FILEMAP, &key, v),
            "blobs" => apply(tx, BLOBS, &key, v),
            "orphans" => apply(tx, ORPHANS, &key, v),
            "blobrefs" => apply(tx, BLOBREFS, &key, v),
            "history" => apply(tx, HISTORY, &key, v),
            "history_undo" => apply(tx, HISTORY_UNDO, &key, v),
            "marks" => apply(tx, MARKS, &key, v),
            "redacted" => apply(tx, REDACTED, &key, v),
            "history_keys" => apply(tx, HISTORY_KEYS, &key, v),
            // A record of a format-8 store (a log left by an earlier release, or a writer
            // running one): its path and time rows go where this format keeps them.
            "history_paths" => {
                let (p, seq) = <(&str, u64) as redb::Value>::from_bytes(&key);
                apply_index_row(tx, &path_index_key(p), seq, v.is_some())
            }
            "history_times" => {
                let (t, seq) = <(i64, u64) as redb::Value>::from_bytes(&key);
                apply_index_row(tx, &time_index_key(t), seq, v.is_some())
            }
            "subtree" => apply(tx, SUBTREE, &key, v),
            "quotas" => apply(tx, QUOTAS, &key, v),
            "deltas" => apply(tx, DELTAS, &key, v),
            "blob_deltas" => apply(tx, BLOB_DELTAS, &key, v),
            other => Err(StoreError::Corrupt(format!(
                "the log names a table this build does not know: {other}"
            ))),
        }?;
        note(&name, &key);
    }
    Ok(())
}

/// When the transaction of a record committed, ns since the epoch: its put of the `meta` key
/// "last_commit" (every commit but a checkpoint's records it). None if it has none or does
/// not decode.
pub(super) fn commit_time(payload: &[u8]) -> Option<i64> {
    let mut rest = payload;
    let mut take = |n: usize| -> Option<&[u8]> {
        (rest.len() >= n).then(|| {
            let (head, tail) = rest.split_at(n);
            rest = tail;
            head
        })
    };
    let mut found = None;
    while let Some(op) = take(1) {
        let op = op[0];
        let name_len = take(1)?[0] as usize;
        let is_meta = take(name_len)? == b"meta";
        let key_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let key = take(key_len)?;
        let is_time = is_meta && key == META_LAST_COMMIT.as_bytes();
        if op == REDO_PUT {
            let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            let v = take(n)?;
            if is_time && v.len() == 8 {
                found = Some(u64::from_le_bytes(v.try_into().ok()?) as i64);
            }
        }
    }
    found
}

const REDO_PUT: u8 = 1;
const REDO_DEL: u8 = 2;

/// Bytes an entry putting a `value_len`-byte value under a u64 key of `table` takes.
pub(super) fn put_entry_len(table: &str, value_len: usize) -> usize {
    2 + table.len() + 4 + 8 + 4 + value_len
}

/// Puts or removes one key of table `def`, as a log record says.
/// Puts (or removes) a path or time row of history's indexes in `history_keys`.
fn apply_index_row(
    tx: &redb::WriteTransaction,
    key: &[u8],
    seq: u64,
    put: bool,
) -> Result<(), StoreError> {
    let mut t = tx.open_table(HISTORY_KEYS).map_err(map_err)?;
    match put {
        true => drop(t.insert((key, seq), [].as_slice()).map_err(map_err)?),
        false => drop(t.remove((key, seq)).map_err(map_err)?),
    }
    Ok(())
}

fn apply<K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &redb::WriteTransaction,
    def: TableDefinition<K, V>,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), StoreError> {
    let mut t = tx.open_table(def).map_err(map_err)?;
    match value {
        Some(v) => drop(
            t.insert(K::from_bytes(key), V::from_bytes(v))
                .map_err(map_err)?,
        ),
        None => drop(t.remove(K::from_bytes(key)).map_err(map_err)?),
    }
    Ok(())
}

/// Appends a put of `key` = `value` in table `def` to a transaction's redo.
pub(super) fn redo_put<K: redb::Key + 'static, V: redb::Value + 'static>(
    redo: &Redo,
    def: TableDefinition<K, V>,
    key: &K::SelfType<'_>,
    value: &V::SelfType<'_>,
) {
    let mut slot = redo.buf.borrow_mut();
    let Some(r) = slot.as_mut() else {
        return;
    };
    let v = V::as_bytes(value);
    if r.len() + v.as_ref().len() > redo.limit {
        // Too large for a record: this transaction commits as a checkpoint, and its content
        // is not copied a second time.
        *slot = None;
        return;
    }
    redo_head(r, REDO_PUT, def, K::as_bytes(key).as_ref());
    r.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    r.extend_from_slice(v.as_ref());
}

/// Appends a removal of `key` from table `def` to a transaction's redo.
pub(super) fn redo_del<K: redb::Key + 'static, V: redb::Value + 'static>(
    redo: &Redo,
    def: TableDefinition<K, V>,
    key: &K::SelfType<'_>,
) {
    if let Some(r) = redo.buf.borrow_mut().as_mut() {
        redo_head(r, REDO_DEL, def, K::as_bytes(key).as_ref());
    }
}

fn redo_head<K: redb::Key + 'static, V: redb::Value + 'static>(
    r: &mut Vec<u8>,
    op: u8,
    def: TableDefinition<K, V>,
    key: &[u8],
) {
    use redb::TableHandle;
    let name = def.name().as_bytes();
    r.push(op);
    r.push(name.len() as u8);
    r.extend_from_slice(name);
    r.extend_from_slice(&(key.len() as u32).to_le_bytes());
    r.extend_from_slice(key);
}
