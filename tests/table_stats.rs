//! Where a store's bytes go, table by table: `REDBFS_STATS_STORE=FILE cargo test --release
//! --test table_stats -- --ignored --nocapture` prints each table's entries and redb's
//! stored, metadata and fragmented bytes, and the file's size. A measuring tool, not a test.

use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};

fn show<K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
    total: &mut [u64; 4],
) {
    let Ok(t) = tx.open_table(def) else {
        return;
    };
    let s = t.stats().unwrap();
    let n = t.len().unwrap();
    let pages = s.leaf_pages() + s.branch_pages();
    println!(
        "{:<14} {:>9} entries {:>11} stored {:>10} meta {:>10} frag {:>7} pages {:>6.1} B/entry",
        def.to_string(),
        n,
        s.stored_bytes(),
        s.metadata_bytes(),
        s.fragmented_bytes(),
        pages,
        (s.stored_bytes() + s.metadata_bytes() + s.fragmented_bytes()) as f64 / n.max(1) as f64,
    );
    total[0] += s.stored_bytes();
    total[1] += s.metadata_bytes();
    total[2] += s.fragmented_bytes();
    total[3] += pages;
}

#[test]
#[ignore]
fn table_stats() {
    let Ok(path) = std::env::var("REDBFS_STATS_STORE") else {
        return;
    };
    let db = redb::Database::open(&path).unwrap();
    let tx = db.begin_read().unwrap();
    let mut t = [0u64; 4];
    show(&tx, TableDefinition::<&str, &[u8]>::new("meta"), &mut t);
    show(&tx, TableDefinition::<u64, &[u8]>::new("inodes"), &mut t);
    show(
        &tx,
        TableDefinition::<(u64, &str), (u64, u8)>::new("dirents"),
        &mut t,
    );
    show(
        &tx,
        TableDefinition::<(u64, u64), u64>::new("filemap"),
        &mut t,
    );
    show(&tx, TableDefinition::<u64, &[u8]>::new("blobs"), &mut t);
    show(&tx, TableDefinition::<u64, u64>::new("blobrefs"), &mut t);
    show(&tx, TableDefinition::<u64, &[u8]>::new("history"), &mut t);
    show(
        &tx,
        TableDefinition::<(u64, u32), &[u8]>::new("history_undo"),
        &mut t,
    );
    show(
        &tx,
        TableDefinition::<(&[u8], u64), &[u8]>::new("history_keys"),
        &mut t,
    );
    show(&tx, TableDefinition::<u64, &[u8]>::new("subtree"), &mut t);
    show(
        &tx,
        TableDefinition::<u64, &[u8]>::new("blob_deltas"),
        &mut t,
    );
    show(
        &tx,
        TableDefinition::<(u64, u64), ()>::new("deltas"),
        &mut t,
    );
    println!(
        "tables: {} stored {} meta {} frag {} pages; file {} bytes",
        t[0],
        t[1],
        t[2],
        t[3],
        std::fs::metadata(&path).unwrap().len()
    );
    drop(tx);
    drop(db);
    // The pages redb's own trees take beside the tables (the table of tables, the allocator
    // state written at close), and what a `compact` of a copy would leave.
    let copy = format!("{path}.stats-copy");
    std::fs::copy(&path, &copy).unwrap();
    let mut db = redb::Database::open(&copy).unwrap();
    let w = db.begin_write().unwrap();
    let s = w.stats().unwrap();
    println!(
        "database: {} allocated pages ({} leaf, {} branch) of {} bytes",
        s.allocated_pages(),
        s.leaf_pages(),
        s.branch_pages(),
        s.page_size()
    );
    w.abort().unwrap();
    db.compact().unwrap();
    drop(db);
    println!(
        "compacted copy: {} bytes",
        std::fs::metadata(&copy).unwrap().len()
    );
    std::fs::remove_file(&copy).unwrap();
}
