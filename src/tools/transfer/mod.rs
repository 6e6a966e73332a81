//! Transfer: `export` of a store's tree to a directory or a tar archive, and `import` of a
//! directory or a tar archive into a store. Both imports stage their source first (`staging`)
//! and commit it in one transaction; both exports read one consistent transaction.

mod export;
mod import;
mod staging;
mod tar;

pub use export::{ExportOptions, ExportReport, export_dir};
pub use import::import;
pub use staging::ImportReport;
pub use tar::{export_tar, import_tar};
