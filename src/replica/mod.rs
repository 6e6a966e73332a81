//! Continuous replication of a store to object storage (S3 and compatible services, Google
//! Cloud Storage, Azure Blob Storage, or a local directory), through the `object_store` crate,
//! and the way back: listing what a replica holds and restoring a store from it.
//!
//! Layout under the replica URL's prefix (every object is written whole under its final name,
//! which object stores make atomic, so a half upload is never visible):
//!
//! ```text
//! generations/<gen>/snapshot.redb                  a consistent copy of the store
//! generations/<gen>/manifest.json                  written after the snapshot: the generation
//!                                                  exists from then on (see `Manifest`)
//! generations/<gen>/segments/<first>-<last>-e<epoch>.seg
//!                                                  the records of commits first..=last, in the
//!                                                  write-ahead log's record layout (numbered,
//!                                                  checksummed under the manifest's log id),
//!                                                  shipped by the writer of that epoch
//! epochs/<epoch>.json                              the writer role (see `epoch`): created with
//!                                                  a conditional put, never overwritten
//! epochs/<epoch>.released                          its writer unmounted and let the role go
//! ```
//!
//! `<gen>` is `e<epoch>-` (the writer's epoch, 20 digits), the generation's start time (20
//! digits of ns since the epoch) and a random suffix, so names sort by writer, then by age;
//! commit numbers are 20 digits, so segments sort by commit. Replicas written before epochs
//! existed have names without them (epoch 0). A generation is restorable at its snapshot's
//! commit and at every commit its segments reach without a gap, counting only what the epochs
//! let stand (`epoch::Fence`): nothing a writer shipped after a newer writer took over. Rooms:
//! `config` what the store keeps (the URLs and the schedule), `ship` the shipping thread of a
//! mount, `epoch` the writer role, `restore` listing, verifying and restoring, `follow` a live
//! read-only copy, `local` reading a `file://` replica safely.
//!
//! A replica is hostile input: anything may have been put there. Reading one goes through a
//! single verified path, for restore and for any reader that follows a generation:
//!
//! - `Target::generation_names`, `Target::manifest`, `Target::segments` list what is there
//!   (names that are not a shipper's are skipped with one warning; a segment is a `Link`
//!   with the size its listing gives, checked against `store::MAX_SEGMENT_BYTES` before any
//!   read);
//! - `Target::read_segment` reads one segment and returns its records verified
//!   (`store::decode_segment`: whole, checksummed, numbered as named, every entry of a known
//!   table with keys and values of the form redb takes), or `ReadError::Bad` naming the
//!   offset at fault;
//! - `restore::walk` reads a generation's chain in commit order and stops at the first gap
//!   or bad segment (`restore::Break`); `restore::records_after` gives the verified records
//!   after a commit as one batch, and `store::apply_verified` applies a batch to a redb
//!   database in one transaction (`store::Rebuild` for a store file rebuilt batch by batch).
//!
//! Every request has a timeout (`io_timeout`), every read a size bound, and a `file://`
//! replica is read without following a symlink below its root and without opening anything
//! but regular files. URLs carrying credentials are refused (`check_url`); every URL shown
//! is redacted (`redact`) and every service error scrubbed of secrets (`scrub`).
//!
//! Invariant kept here: a replica only ever holds a prefix of the store's commits: segments
//! are uploaded one after the other, each following the last, and only once uploaded whole
//! does the shipper move on; what a fenced writer uploads is never read back.

pub mod config;
pub mod epoch;
pub mod follow;
mod local;
pub mod restore;
pub mod ship;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutPayload};
use serde::{Deserialize, Serialize};

pub use config::{ReplicaOverrides, Settings};
pub use follow::Follower;
pub use ship::Replication;

/// What a generation's `manifest.json` says.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// The layout version of this replica format.
    pub version: u32,
    pub generation: String,
    /// The id its segments' records are checksummed under.
    pub log_id: u64,
    /// The commit number the snapshot holds.
    pub commit: u64,
    /// When that commit committed, ns since the epoch.
    pub commit_time_ns: i64,
    /// When the generation started, ns since the epoch.
    pub started_ns: i64,
    pub snapshot_bytes: u64,
}

/// A manifest is a few hundred bytes; one larger than this is not ours and is not read.
const MAX_MANIFEST_BYTES: u64 = 64 * 1024;
/// Objects are read in ranges of at most this much: one request each, each under the timeout.
const READ_CHUNK: u64 = 8 * 1024 * 1024;

/// One segment as a generation's listing shows it, before anything of it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Link {
    pub first: u64,
    pub last: u64,
    pub size: u64,
    /// The epoch of the writer that shipped it (0 before epochs).
    pub epoch: u64,
}

impl Link {
    /// Its object name under the generation.
    pub fn name(&self) -> String {
        segment_name(self.first, self.last, self.epoch)
    }
}

/// One replica: an object store and the prefix under which this store's replica lives. A
/// `file://` replica is read by `local` (no symlink followed, nothing but regular files) and
/// written through `object_store`'s local store; every request is bounded by `io_timeout`.
#[derive(Clone)]
pub struct Target {
    /// The URL as given (it never holds credentials: `check_url` refuses those).
    pub url: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    /// The directory of a `file://` replica.
    local: Option<PathBuf>,
    /// What the epochs let stand, once `load_fence` read them; None: everything stands.
    fence: Arc<Mutex<Option<epoch::Fence>>>,
}

/// rustls's process-wide crypto provider: ring (Cargo.toml says why not aws-lc-rs). reqwest
/// is built without a provider of its own and panics on a client built before one is set.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means one is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// How long one request to a replica may take before it counts as failed: 60 s, or
/// `REDBFS_REPLICA_TIMEOUT` seconds. Long enough for a segment over a slow link, short enough
/// that a hung share or a stalled server shows as an outage and an unmount waits that long at
/// most for its last upload.
pub fn io_timeout() -> Duration {
    std::env::var("REDBFS_REPLICA_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(60), Duration::from_secs_f64)
}

/// Retries and timeouts of requests to a service: short enough that an outage shows within
/// seconds, long enough for a slow link; each call is bounded by `io_timeout` on top.
fn client() -> (object_store::RetryConfig, object_store::ClientOptions) {
    let timeout = io_timeout();
    let retry = object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(10).min(timeout),
        ..Default::default()
    };
    let options = object_store::ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5).min(timeout))
        .with_timeout(timeout);
    (retry, options)
}

/// Refuses a replica URL that carries credentials (user info) or any query (where presigned
/// and SAS forms put theirs; a replica URL needs none): the URL is kept in the store, shown by
/// `status` and logged, so secrets go through the service's environment or its credentials
/// file instead. The error shows the URL redacted.
pub fn check_url(url: &str) -> Result<(), String> {
    let Ok(parsed) = url::Url::parse(url) else {
        return Ok(());
    };
    let where_from = "give credentials through the environment (AWS_ACCESS_KEY_ID and \
                      AWS_SECRET_ACCESS_KEY, GOOGLE_SERVICE_ACCOUNT, AZURE_STORAGE_ACCOUNT_KEY, \
                      ...) or the service's credentials file: a replica URL is kept in the store \
                      and shown by `status` and the logs";
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(format!(
            "replica {}: the URL carries credentials; {where_from}",
            redact(url)
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!(
            "replica {}: a replica URL takes no query parameters; {where_from}",
            redact(url)
        ));
    }
    Ok(())
}

/// `url` with any user info and query replaced by `***`, for every place a URL is shown.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let mut hidden = false;
            if !u.username().is_empty() || u.password().is_some() {
                hidden = u.set_username("***").is_ok() && u.set_password(None).is_ok();
            }
            if u.query().is_some() || u.fragment().is_some() {
                u.set_query(Some("***"));
                u.set_fragment(None);
                hidden = true;
            }
            if hidden {
                u.to_string()
            } else {
                url.to_string()
            }
        }
        Err(_) => scrub(url),
    }
}

/// `text` (an error from a service's client) with the user info of every URL in it replaced,
/// and the values of the environment's secrets removed.
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace() || c == '"')
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    for (k, v) in std::env::vars() {
        let k = k.to_ascii_uppercase();
        let secret = ["SECRET", "TOKEN", "PASSWORD", "KEY"]
            .iter()
            .any(|s| k.contains(s))
            && !k.ends_with("KEY_ID");
        if secret && v.len() >= 8 && out.contains(&v) {
            out = out.replace(&v, "***");
        }
    }
    out
}

fn err(e: impl std::fmt::Display) -> String {
    scrub(&e.to_string())
}

/// Runs `f` under the request timeout; `what` names the request in the error.
async fn bounded<T>(what: &str, f: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    match tokio::time::timeout(io_timeout(), f).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "{what}: no answer within {:?} (REDBFS_REPLICA_TIMEOUT)",
            io_timeout()
        )),
    }
}

/// Runs blocking `f` (a `file://` replica's I/O) on the runtime's blocking threads under the
/// request timeout. A thread stuck on a hung share is left behind: `Io` never waits for it.
/// What `local` refuses (`InvalidData`: a symlink, not a regular file) is `ReadError::Bad`.
async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, ReadError> {
    let done = tokio::time::timeout(io_timeout(), tokio::task::spawn_blocking(f)).await;
    match done {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) if e.kind() == std::io::ErrorKind::InvalidData => {
            Err(ReadError::Bad(format!("{what}: {e}")))
        }
        Ok(Ok(Err(e))) => Err(ReadError::Unreachable(format!("{what}: {e}"))),
        Ok(Err(e)) => Err(ReadError::Unreachable(format!("{what}: {e}"))),
        Err(_) => Err(ReadError::Unreachable(format!(
            "{what}: no answer within {:?} (REDBFS_REPLICA_TIMEOUT)",
            io_timeout()
        ))),
    }
}

/// A generation's name as a shipper makes it: 20 digits, a dash, 8 hex digits; since epochs,
/// `e`, the epoch's 20 digits and a dash before that.
fn is_generation_name(name: &str) -> bool {
    let name = match name.strip_prefix('e') {
        Some(rest) if rest.len() > 21 && rest.as_bytes()[20] == b'-' => {
            if !rest.as_bytes()[..20].iter().all(u8::is_ascii_digit) {
                return false;
            }
            &rest[21..]
        }
        Some(_) => return false,
        None => name,
    };
    let b = name.as_bytes();
    b.len() == 29
        && b[20] == b'-'
        && b[..20].iter().all(u8::is_ascii_digit)
        && b[21..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// A segment's (first, last, epoch) from its object name, if it is one a shipper makes
/// (epoch 0: named before epochs).
fn parse_segment_name(name: &str) -> Option<(u64, u64, u64)> {
    let name = name.strip_suffix(".seg")?;
    let (name, epoch) = match name.split_once("-e") {
        Some((n, e)) => (n, decimal20(e)?),
        None => (name, 0),
    };
    let (a, b) = name.split_once('-')?;
    let (first, last) = (decimal20(a)?, decimal20(b)?);
    (first <= last).then_some((first, last, epoch))
}

/// A number as a replica's names write it: exactly 20 decimal digits. Nothing else names the
/// same object (`+1…` or a shorter form would parse to a number whose name is another).
pub(super) fn decimal20(s: &str) -> Option<u64> {
    (s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Warns once about the entries of a listing that are not part of a replica.
fn warn_foreign(url: &str, under: &str, names: &[String]) {
    if let Some(first) = names.first() {
        tracing::warn!(replica = %redact(url), "{under}: skipped {} entr{} that a replica never holds ({first}{})",
            names.len(), if names.len() == 1 { "y" } else { "ies" },
            if names.len() > 1 { ", ..." } else { "" });
    }
}

impl Target {
    /// The replica at `url`: `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix` (credentials, region and endpoint from each service's standard
    /// environment, such as `AWS_ENDPOINT_URL`) or `file:///path` (created when `create`).
    /// Nothing else is contacted yet. A URL carrying credentials is refused (`check_url`).
    pub fn open(url: &str) -> Result<Target, String> {
        Target::open_with(url, true)
    }

    /// As `open`, without creating a `file://` replica's directory (reading one that is not
    /// there finds nothing).
    pub fn open_existing(url: &str) -> Result<Target, String> {
        Target::open_with(url, false)
    }

    /// Checks that `url` names a replica `open` can reach (its form, no credentials in it),
    /// touching nothing: a `file://` directory on a hung share cannot hold the caller.
    pub fn check(url: &str) -> Result<(), String> {
        check_url(url)?;
        let parsed = url::Url::parse(url).map_err(|e| format!("replica {}: {e}", redact(url)))?;
        if parsed.scheme() == "file" {
            return parsed
                .to_file_path()
                .map(drop)
                .map_err(|()| format!("replica {}: not a local path", redact(url)));
        }
        Target::open_with(url, false).map(drop)
    }

    fn open_with(url: &str, create: bool) -> Result<Target, String> {
        install_tls_provider();
        check_url(url)?;
        let bad = |e: &dyn std::fmt::Display| format!("replica {}: {}", redact(url), err(e));
        let parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(&e))?;
        let (retry, options) = client();
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::Local => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| bad(&"not a local path"))?;
                if create {
                    std::fs::create_dir_all(&dir).map_err(|e| bad(&e))?;
                } else if std::fs::metadata(&dir).is_err() {
                    return Err(bad(&"no such directory"));
                }
                // Directories emptied by a removal go too: a local listing names every
                // directory, and a pruned generation must not stay listed.
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(&e))?
                    .with_automatic_cleanup(true);
                return Ok(Target {
                    url: url.to_string(),
                    store: Arc::new(local),
                    prefix: ObjPath::default(),
                    local: Some(dir),
                    fence: Arc::default(),
                });
            }
            ObjectStoreScheme::AmazonS3 => {
                // Our timeouts first, then the service's environment (which may set more
                // client options, such as AWS_ALLOW_HTTP), then the URL.
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_retry(retry)
                    .with_client_options(options);
                for (k, v) in env_with("AWS_") {
                    if let Ok(key) = k.parse::<object_store::aws::AmazonS3ConfigKey>() {
                        b = b.with_config(key, v);
                    }
                }
                Arc::new(b.with_url(url).build().map_err(|e| bad(&e))?)
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
                    .with_retry(retry)
                    .with_client_options(options);
                for (k, v) in env_with("GOOGLE_") {
                    if let Ok(key) = k.parse::<object_store::gcp::GoogleConfigKey>() {
                        b = b.with_config(key, v);
                    }
                }
                Arc::new(b.with_url(url).build().map_err(|e| bad(&e))?)
            }
            ObjectStoreScheme::MicrosoftAzure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::new()
                    .with_retry(retry)
                    .with_client_options(options);
                for (k, v) in env_with("AZURE_") {
                    if let Ok(key) = k.parse::<object_store::azure::AzureConfigKey>() {
                        b = b.with_config(key, v);
                    }
                }
                Arc::new(b.with_url(url).build().map_err(|e| bad(&e))?)
            }
            _ => {
                return Err(bad(
                    &"only s3://, gs://, az:// and file:// replicas are supported",
                ));
            }
        };
        let prefix = ObjPath::parse(path).map_err(|e| bad(&e))?;
        Ok(Target {
            url: url.to_string(),
            store,
            prefix,
            local: None,
            fence: Arc::default(),
        })
    }

    /// Reads the epochs: from now on what a fenced writer shipped is not listed.
    pub(crate) async fn load_fence(&self) -> Result<(), String> {
        let known = self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let fence = epoch::Fence::read(self, known).await?;
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = Some(fence);
        Ok(())
    }

    /// Whether the epochs let (generation, epoch, commit) stand (see `epoch::Fence`).
    fn stands(&self, generation: &str, epoch: u64, commit: u64) -> bool {
        match &*self.fence.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => f.stands(generation, epoch, commit),
            None => true,
        }
    }

    /// The URL as it may be shown.
    pub fn shown(&self) -> String {
        redact(&self.url)
    }

    /// The directory of a `file://` replica.
    pub fn local_dir(&self) -> Option<&Path> {
        self.local.as_deref()
    }

    fn path(&self, rest: &str) -> ObjPath {
        let mut p = self.prefix.clone();
        for part in rest.split('/').filter(|s| !s.is_empty()) {
            p = p.join(part);
        }
        p
    }

    fn gen_path(&self, generation: &str, rest: &str) -> ObjPath {
        self.path(&format!("generations/{generation}/{rest}"))
    }

    /// The components of `p` below a `file://` replica's directory.
    fn parts(p: &ObjPath) -> Vec<String> {
        p.parts().map(|x| x.as_ref().to_string()).collect()
    }

    async fn put(&self, path: &ObjPath, bytes: Vec<u8>) -> Result<(), String> {
        bounded(&format!("uploading {path}"), async {
            self.store
                .put(path, PutPayload::from(bytes))
                .await
                .map(drop)
                .map_err(err)
        })
        .await
    }

    /// The size of object `path`; None when it does not exist.
    async fn size_of(&self, path: &ObjPath) -> Result<Option<u64>, ReadError> {
        let what = format!("reading {path}");
        if let Some(root) = &self.local {
            let (root, parts) = (root.clone(), Target::parts(path));
            return blocking(&what, move || match local::open(&root, &parts) {
                Ok((_, size)) => Ok(Some(size)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            })
            .await;
        }
        bounded(&what, async {
            match self.store.head(path).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(err(e)),
            }
        })
        .await
        .map_err(ReadError::Unreachable)
    }

    /// Bytes `range` of object `path` (the range lies within its size), one request.
    async fn read_range(
        &self,
        path: &ObjPath,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, ReadError> {
        let what = format!("reading {path}");
        let want = (range.end - range.start) as usize;
        let got = if let Some(root) = &self.local {
            let (root, parts) = (root.clone(), Target::parts(path));
            blocking(&what, move || {
                let (f, _) = local::open(&root, &parts)?;
                local::read_at(&f, range.start, want)
            })
            .await?
        } else {
            bounded(&what, async {
                self.store
                    .get_range(path, range)
                    .await
                    .map(|b| b.to_vec())
                    .map_err(err)
            })
            .await
            .map_err(ReadError::Unreachable)?
        };
        if got.len() != want {
            return Err(ReadError::Bad(format!(
                "{what}: it changed while being read"
            )));
        }
        Ok(got)
    }

    /// Object `path` whole, refused unread when its size is over `max` (or not `expected`
    /// when given, as its listing said); None when it does not exist.
    async fn get_bounded(
        &self,
        path: &ObjPath,
        max: u64,
        expected: Option<u64>,
    ) -> Result<Option<Vec<u8>>, ReadError> {
        let Some(size) = self.size_of(path).await? else {
            return Ok(None);
        };
        if size > max {
            return Err(ReadError::Bad(format!(
                "{path}: {size} bytes, over the limit of {max}"
            )));
        }
        if expected.is_some_and(|e| e != size) {
            return Err(ReadError::Bad(format!(
                "{path}: it changed while being read"
            )));
        }
        let mut out = Vec::with_capacity(size as usize);
        while (out.len() as u64) < size {
            let at = out.len() as u64;
            let chunk = self.read_range(path, at..size.min(at + READ_CHUNK)).await?;
            out.extend_from_slice(&chunk);
        }
        Ok(Some(out))
    }

    /// Streams object `path`, listed at `expected` bytes (what its manifest says), into `file`
    /// in ranges, each under the timeout. An object of any other size is refused before a
    /// byte of it is read: what anyone may put in the bucket never decides how much is
    /// written to the local disk.
    async fn get_to_file(
        &self,
        path: &ObjPath,
        file: &mut std::fs::File,
        expected: u64,
    ) -> Result<(), String> {
        use std::io::Write;
        let size = self
            .size_of(path)
            .await?
            .ok_or_else(|| format!("{path}: missing"))?;
        if size != expected {
            return Err(format!(
                "{path} holds {size} bytes, its manifest says {expected}"
            ));
        }
        let mut at = 0;
        while at < size {
            let chunk = self.read_range(path, at..size.min(at + READ_CHUNK)).await?;
            file.write_all(&chunk).map_err(|e| e.to_string())?;
            at += chunk.len() as u64;
        }
        Ok(())
    }

    /// What lies directly under `dir`: (subdirectory names, (object name, size)); names that
    /// are not UTF-8 are returned apart, escaped for showing.
    async fn list_dir(
        &self,
        dir: &ObjPath,
    ) -> Result<(Vec<String>, Vec<(String, u64)>, Vec<String>), String> {
        let what = format!("listing {dir}");
        if let Some(root) = &self.local {
            let (root, parts) = (root.clone(), Target::parts(dir));
            let entries = blocking(&what, move || local::list(&root, &parts))
                .await
                .map_err(String::from)?;
            let (mut dirs, mut objects, mut odd) = (Vec::new(), Vec::new(), Vec::new());
            for e in entries {
                let raw = e.name.into_encoded_bytes();
                let Ok(name) = String::from_utf8(raw.clone()) else {
                    odd.push(crate::private::escape(&raw));
                    continue;
                };
                match e.kind {
                    local::Kind::Dir => dirs.push(name),
                    // A symlink or a FIFO under an object's name: listed, and refused when read.
                    _ => objects.push((name, e.size)),
                }
            }
            return Ok((dirs, objects, odd));
        }
        bounded(&what, async {
            let list = self
                .store
                .list_with_delimiter(Some(dir))
                .await
                .map_err(err)?;
            let dirs = list
                .common_prefixes
                .iter()
                .filter_map(|p| p.filename().map(str::to_string))
                .collect();
            let objects = list
                .objects
                .iter()
                .filter_map(|o| Some((o.location.filename()?.to_string(), o.size)))
                .collect();
            Ok((dirs, objects, Vec::new()))
        })
        .await
    }

    /// The generations' names, oldest first (those without a manifest too). Anything else
    /// under `generations/` is skipped with one warning.
    pub async fn generation_names(&self) -> Result<Vec<String>, String> {
        let (dirs, objects, mut odd) = self.list_dir(&self.path("generations")).await?;
        let mut names = Vec::new();
        for d in dirs {
            if is_generation_name(&d) {
                names.push(d);
            } else {
                odd.push(d);
            }
        }
        odd.extend(objects.into_iter().map(|o| o.0));
        warn_foreign(&self.url, "generations/", &odd);
        names.sort();
        Ok(names)
    }

    /// A generation's manifest; None when it has none (its upload never finished). A
    /// manifest that does not parse, or names another generation, is an error.
    pub async fn manifest(&self, generation: &str) -> Result<Option<Manifest>, ReadError> {
        let at = self.gen_path(generation, "manifest.json");
        let Some(bytes) = self.get_bounded(&at, MAX_MANIFEST_BYTES, None).await? else {
            return Ok(None);
        };
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| ReadError::Bad(format!("{generation}/manifest.json: {e}")))?;
        if m.generation != generation || m.version != 1 {
            return Err(ReadError::Bad(format!(
                "{generation}/manifest.json: describes generation {:?} of layout {}",
                m.generation, m.version
            )));
        }
        // A generation a fenced writer started after the takeover is not offered.
        let stands = self.stands(generation, epoch_of_generation(generation), m.commit);
        Ok(stands.then_some(m))
    }

    /// A generation's segments as listed, by first commit (the longest first among those
    /// starting at the same commit), those the epochs let stand (see `load_fence`). Anything
    /// else under `segments/` is skipped with one warning.
    pub async fn segments(&self, generation: &str) -> Result<Vec<Link>, String> {
        let mut all = self.all_segments(generation).await?;
        all.retain(|l| self.stands(generation, l.epoch, l.last));
        Ok(all)
    }

    /// A generation's segments as listed, fenced writers' too.
    async fn all_segments(&self, generation: &str) -> Result<Vec<Link>, String> {
        let (dirs, objects, mut odd) = self
            .list_dir(&self.gen_path(generation, "segments"))
            .await?;
        odd.extend(dirs);
        let mut out = Vec::new();
        for (name, size) in objects {
            match parse_segment_name(&name) {
                Some((first, last, epoch)) => out.push(Link {
                    first,
                    last,
                    size,
                    epoch,
                }),
                None => odd.push(name),
            }
        }
        warn_foreign(
            &self.url,
            &format!("generations/{generation}/segments/"),
            &odd,
        );
        out.sort_by_key(|l| (l.first, std::cmp::Reverse(l.last)));
        Ok(out)
    }

    /// Segment `link` of generation `m`, decoded and verified (see `store::decode_segment`):
    /// refused unread when the listing gives it a size no shipper writes.
    pub async fn read_segment(
        &self,
        m: &Manifest,
        link: &Link,
    ) -> Result<Vec<crate::store::VerifiedRecord>, ReadError> {
        let limit = crate::store::MAX_SEGMENT_BYTES;
        if link.size > limit {
            return Err(ReadError::Bad(format!(
                "{} bytes, over the limit of {limit}; not read",
                link.size
            )));
        }
        let path = self.gen_path(&m.generation, &link.name());
        let bytes = self
            .get_bounded(&path, limit, Some(link.size))
            .await?
            .ok_or_else(|| ReadError::Bad(format!("{path}: listed, but gone when read")))?;
        crate::store::decode_segment(m.log_id, &bytes, link.first, link.last)
            .map_err(|f| ReadError::Bad(f.to_string()))
    }

    /// Removes every object of a generation.
    async fn remove_generation(&self, generation: &str) -> Result<(), String> {
        // The manifest first: without it the generation is no longer offered for restore, and
        // a reader that sees its objects vanish finds it unfinished, not broken.
        self.delete(&self.gen_path(generation, "manifest.json"))
            .await?;
        for link in self.all_segments(generation).await? {
            self.delete(&self.gen_path(generation, &link.name()))
                .await?;
        }
        self.delete(&self.gen_path(generation, "snapshot.redb"))
            .await
    }

    async fn delete(&self, path: &ObjPath) -> Result<(), String> {
        bounded(&format!("removing {path}"), async {
            match self.store.delete(path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(err(e)),
            }
        })
        .await
    }
}

/// Why an object of a replica could not be used.
#[derive(Clone, Debug)]
pub enum ReadError {
    /// What is there is not what a shipper writes (damaged, forged, too large, a symlink or
    /// not a regular file): the replica is broken there.
    Bad(String),
    /// It could not be read (the replica is out of reach, or did not answer in time).
    Unreachable(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Bad(s) | ReadError::Unreachable(s) => f.write_str(s),
        }
    }
}

impl From<ReadError> for String {
    fn from(e: ReadError) -> String {
        match e {
            ReadError::Bad(s) | ReadError::Unreachable(s) => s,
        }
    }
}

/// The environment's variables starting with `prefix`, names in lower case (as each
/// builder's `from_env` reads them).
fn env_with(prefix: &str) -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect()
}

/// A segment's name under its generation; epoch 0 is a replica's from before epochs.
fn segment_name(first: u64, last: u64, epoch: u64) -> String {
    if epoch == 0 {
        format!("segments/{first:020}-{last:020}.seg")
    } else {
        format!("segments/{first:020}-{last:020}-e{epoch:020}.seg")
    }
}

/// A new generation's name: its writer's epoch, when it started, a random suffix.
fn generation_name(epoch: u64, started_ns: i64, random: u32) -> String {
    format!("e{epoch:020}-{started_ns:020}-{random:08x}")
}

/// The epoch of the writer that started a generation, from its name (0 before epochs).
fn epoch_of_generation(generation: &str) -> u64 {
    generation
        .strip_prefix('e')
        .and_then(|g| g.split_once('-'))
        .and_then(|(e, _)| e.parse().ok())
        .unwrap_or(0)
}

/// When a generation started, from its name.
fn started_of(generation: &str) -> Option<i64> {
    let g = match generation.strip_prefix('e') {
        Some(rest) => rest.split_once('-')?.1,
        None => generation,
    };
    g.split_once('-')?.0.parse().ok()
}

/// A runtime for `object_store` on the calling thread. Dropping it never waits for a
/// blocking thread stuck on a replica's I/O (it is left behind; the timeout already failed
/// the call).
pub struct Io {
    rt: Option<tokio::runtime::Runtime>,
}

impl Io {
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        match &self.rt {
            Some(rt) => rt.block_on(f),
            None => unreachable!("the runtime lives until dropped"),
        }
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn runtime() -> Result<Io, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|rt| Io { rt: Some(rt) })
        .map_err(|e| format!("starting the replica's I/O runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_epoch_and_old_ones_read_as_epoch_0() {
        let g = generation_name(3, 1_700_000_000_000_000_000, 0xab);
        assert!(is_generation_name(&g), "{g}");
        assert_eq!(epoch_of_generation(&g), 3);
        assert_eq!(started_of(&g), Some(1_700_000_000_000_000_000));
        let old = "01700000000000000000-000000ab";
        assert!(is_generation_name(old));
        assert_eq!(epoch_of_generation(old), 0);
        assert_eq!(started_of(old), Some(1_700_000_000_000_000_000));
        assert!(
            old < g.as_str(),
            "a writer with epochs sorts after the old ones"
        );
        for (first, last, epoch) in [(1, 9, 0), (10, 12, 7)] {
            let name = segment_name(first, last, epoch);
            let file = name.strip_prefix("segments/").unwrap();
            assert_eq!(parse_segment_name(file), Some((first, last, epoch)));
        }
        assert_eq!(parse_segment_name("1-2-x.seg"), None);
    }

    #[test]
    fn urls_with_credentials_are_refused_and_shown_redacted() {
        for url in [
            "s3://ID:Secret@bucket/p",
            "s3://ID@bucket/p",
            "s3://bucket/p?token=Secret",
            "az://container/p?sv=2020&sig=Secret",
        ] {
            let e = check_url(url).unwrap_err();
            assert!(!e.contains("Secret"), "{e}");
            assert!(e.contains("environment"), "{e}");
        }
        assert!(check_url("s3://bucket/agents/alice").is_ok());
        assert!(check_url("file:///var/backup/memory").is_ok());
        assert_eq!(redact("s3://ID:Secret@bucket/p"), "s3://***@bucket/p");
        assert_eq!(redact("s3://bucket/p"), "s3://bucket/p");
        assert!(!redact("s3://bucket/p?token=Secret").contains("Secret"));
    }

    #[test]
    fn errors_are_scrubbed_of_user_info() {
        let e = "error sending request for url (http://user:pw@127.0.0.1:9/bucket/x): refused";
        assert_eq!(
            scrub(e),
            "error sending request for url (http://***@127.0.0.1:9/bucket/x): refused"
        );
        assert_eq!(scrub("no url here"), "no url here");
    }

    #[test]
    fn only_a_shippers_names_are_taken() {
        assert!(is_generation_name("01796182898594495904-edac66a3"));
        assert!(!is_generation_name("01796182898594495904-EDAC66A3"));
        assert!(!is_generation_name("../../etc"));
        assert_eq!(
            parse_segment_name("00000000000000000005-00000000000000000009.seg"),
            Some((5, 9, 0))
        );
        assert_eq!(
            parse_segment_name(
                "00000000000000000005-00000000000000000009-e00000000000000000002.seg"
            ),
            Some((5, 9, 2))
        );
        assert_eq!(
            parse_segment_name("00000000000000000005-00000000000000000009-e2.seg"),
            None
        );
        assert!(!is_generation_name("e00000000000000000001-0179"));
        assert_eq!(
            parse_segment_name("00000000000000000009-00000000000000000005.seg"),
            None
        );
        assert_eq!(parse_segment_name("5-9.seg"), None);
    }
}
