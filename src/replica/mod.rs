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
//! mount, `epoch` the writer role, `restore` listing and restoring, `follow` a live read-only
//! copy.
//!
//! Invariant kept here: a replica only ever holds a prefix of the store's commits: segments
//! are uploaded one after the other, each following the last, and only once uploaded whole
//! does the shipper move on; what a fenced writer uploads is never read back.

pub mod config;
pub mod epoch;
pub mod follow;
pub mod restore;
pub mod ship;

use std::collections::HashMap;
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

/// One replica: an object store and the prefix under which this store's replica lives.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    /// What the epochs let stand, once `load_fence` read them; None: everything stands.
    fence: Arc<Mutex<Option<epoch::Fence>>>,
    /// The epoch of each segment `segments` listed, by (generation, first, last): a segment's
    /// object name holds it.
    segment_epochs: Arc<Mutex<SegmentEpochs>>,
}

/// The epoch of each segment listed, by (generation, first, last).
type SegmentEpochs = HashMap<(String, u64, u64), u64>;

/// rustls's process-wide crypto provider: ring (Cargo.toml says why not aws-lc-rs). reqwest
/// is built without a provider of its own and panics on a client built before one is set.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means one is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Retries and timeouts of requests to a service: short enough that an outage shows within
/// seconds (and an unmount waits for at most one attempt), long enough for a slow link.
fn client() -> (object_store::RetryConfig, object_store::ClientOptions) {
    let retry = object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let options = object_store::ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(120));
    (retry, options)
}

impl Target {
    /// The replica at `url`: `s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix` (credentials, region and endpoint from each service's standard
    /// environment, such as `AWS_ENDPOINT_URL`) or `file:///path` (created if missing). Nothing
    /// is contacted yet.
    pub fn open(url: &str) -> Result<Target, String> {
        install_tls_provider();
        let bad = |e: &dyn std::fmt::Display| format!("replica {url}: {e}");
        let parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
        let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(&e))?;
        let (retry, options) = client();
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::Local => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| bad(&"not a local path"))?;
                std::fs::create_dir_all(&dir).map_err(|e| bad(&e))?;
                // Directories emptied by a removal go too: a local listing names every
                // directory, and a pruned generation must not stay listed.
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| bad(&e))?
                    .with_automatic_cleanup(true);
                return Ok(Target::over(url, Arc::new(local), ObjPath::default()));
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
                // Our timeouts first, then the service's environment (which may set more
                // client options, such as AWS_ALLOW_HTTP), then the URL.
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
                // Our timeouts first, then the service's environment (which may set more
                // client options, such as AWS_ALLOW_HTTP), then the URL.
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
        Ok(Target::over(url, store, prefix))
    }

    fn over(url: &str, store: Arc<dyn ObjectStore>, prefix: ObjPath) -> Target {
        Target {
            url: url.to_string(),
            store,
            prefix,
            fence: Arc::default(),
            segment_epochs: Arc::default(),
        }
    }

    /// Reads the epochs: from now on what a fenced writer shipped is not listed.
    async fn load_fence(&self) -> Result<(), String> {
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

    async fn put(&self, path: &ObjPath, bytes: Vec<u8>) -> Result<(), String> {
        self.store
            .put(path, PutPayload::from(bytes))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    async fn get(&self, path: &ObjPath) -> Result<Vec<u8>, String> {
        let got = self.store.get(path).await.map_err(|e| e.to_string())?;
        Ok(got.bytes().await.map_err(|e| e.to_string())?.to_vec())
    }

    /// The generations' names, oldest first (those without a manifest too).
    async fn generation_names(&self) -> Result<Vec<String>, String> {
        let list = self
            .store
            .list_with_delimiter(Some(&self.path("generations")))
            .await
            .map_err(|e| e.to_string())?;
        let mut names: Vec<String> = list
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    async fn manifest(&self, generation: &str) -> Result<Option<Manifest>, String> {
        match self
            .store
            .get(&self.gen_path(generation, "manifest.json"))
            .await
        {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(|e| e.to_string())?;
                let m: Manifest = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{generation}/manifest.json: {e}"))?;
                // A generation a fenced writer started after the takeover is not offered.
                let stands = self.stands(generation, epoch_of_generation(generation), m.commit);
                Ok(stands.then_some(m))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A generation's segments as (first, last, size), by first commit: those the epochs let
    /// stand (see `load_fence`).
    async fn segments(&self, generation: &str) -> Result<Vec<(u64, u64, u64)>, String> {
        let list = self
            .store
            .list_with_delimiter(Some(&self.gen_path(generation, "segments")))
            .await
            .map_err(|e| e.to_string())?;
        let mut epochs = self
            .segment_epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(u64, u64, u64)> = Vec::new();
        for o in &list.objects {
            let Some((first, last, epoch)) = o.location.filename().and_then(parse_segment_name)
            else {
                continue;
            };
            if self.stands(generation, epoch, last) {
                epochs.insert((generation.to_string(), first, last), epoch);
                out.push((first, last, o.size));
            }
        }
        out.sort_by_key(|&(first, last, _)| (first, std::cmp::Reverse(last)));
        Ok(out)
    }

    async fn segment(&self, generation: &str, first: u64, last: u64) -> Result<Vec<u8>, String> {
        let epoch = self
            .segment_epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(generation.to_string(), first, last))
            .copied()
            .unwrap_or(0);
        self.get(&self.gen_path(generation, &segment_name(first, last, epoch)))
            .await
    }

    /// Removes every object of a generation.
    async fn remove_generation(&self, generation: &str) -> Result<(), String> {
        let list = self
            .store
            .list_with_delimiter(Some(&self.gen_path(generation, "segments")))
            .await
            .map_err(|e| e.to_string())?;
        for o in &list.objects {
            self.delete(&o.location).await?;
        }
        // The manifest first: without it the generation is no longer offered for restore.
        for name in ["manifest.json", "snapshot.redb"] {
            self.delete(&self.gen_path(generation, name)).await?;
        }
        Ok(())
    }

    async fn delete(&self, path: &ObjPath) -> Result<(), String> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.to_string()),
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

/// (first, last, epoch) from a segment's file name.
fn parse_segment_name(name: &str) -> Option<(u64, u64, u64)> {
    let name = name.strip_suffix(".seg")?;
    let mut parts = name.split('-');
    let first = parts.next()?.parse().ok()?;
    let last = parts.next()?.parse().ok()?;
    let epoch = match parts.next() {
        None => 0,
        Some(e) => e.strip_prefix('e')?.parse().ok()?,
    };
    parts.next().is_none().then_some((first, last, epoch))
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

/// A runtime for `object_store` on the calling thread.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the replica's I/O runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_epoch_and_old_ones_read_as_epoch_0() {
        let g = generation_name(3, 1_700_000_000_000_000_000, 0xab);
        assert_eq!(epoch_of_generation(&g), 3);
        assert_eq!(started_of(&g), Some(1_700_000_000_000_000_000));
        let old = "01700000000000000000-000000ab";
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
}
