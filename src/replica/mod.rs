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
//! generations/<gen>/segments/<first>-<last>.seg    the records of commits first..=last, in the
//!                                                  write-ahead log's record layout (numbered,
//!                                                  checksummed under the manifest's log id)
//! ```
//!
//! `<gen>` is the generation's start time (20 digits of ns since the epoch) and a random
//! suffix, so names sort by age; commit numbers are 20 digits, so segments sort by commit.
//! A generation is restorable at its snapshot's commit and at every commit its segments reach
//! without a gap. Rooms: `config` what the store keeps (the URLs and the schedule), `ship` the
//! shipping thread of a mount, `restore` listing and restoring.
//!
//! Invariant kept here: a replica only ever holds a prefix of the store's commits: segments
//! are uploaded one after the other, each following the last, and only once uploaded whole
//! does the shipper move on.

pub mod config;
pub mod restore;
pub mod ship;

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutPayload};
use serde::{Deserialize, Serialize};

pub use config::{ReplicaOverrides, Settings};
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
                return Ok(Target {
                    url: url.to_string(),
                    store: Arc::new(local),
                    prefix: ObjPath::default(),
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
        Ok(Target {
            url: url.to_string(),
            store,
            prefix,
        })
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
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| format!("{generation}/manifest.json: {e}"))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A generation's segments as (first, last, size), by first commit.
    async fn segments(&self, generation: &str) -> Result<Vec<(u64, u64, u64)>, String> {
        let list = self
            .store
            .list_with_delimiter(Some(&self.gen_path(generation, "segments")))
            .await
            .map_err(|e| e.to_string())?;
        let mut out: Vec<(u64, u64, u64)> = list
            .objects
            .iter()
            .filter_map(|o| {
                let name = o.location.filename()?.strip_suffix(".seg")?;
                let (a, b) = name.split_once('-')?;
                Some((a.parse().ok()?, b.parse().ok()?, o.size))
            })
            .collect();
        out.sort_by_key(|&(first, last, _)| (first, std::cmp::Reverse(last)));
        Ok(out)
    }

    async fn segment(&self, generation: &str, first: u64, last: u64) -> Result<Vec<u8>, String> {
        self.get(&self.gen_path(generation, &segment_name(first, last)))
            .await
    }

    /// Removes every object of a generation.
    async fn remove_generation(&self, generation: &str) -> Result<(), String> {
        for (first, last, _) in self.segments(generation).await? {
            self.delete(&self.gen_path(generation, &segment_name(first, last)))
                .await?;
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

fn segment_name(first: u64, last: u64) -> String {
    format!("segments/{first:020}-{last:020}.seg")
}

/// When a generation started, from its name.
fn started_of(generation: &str) -> Option<i64> {
    generation.split_once('-')?.0.parse().ok()
}

/// A runtime for `object_store` on the calling thread.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the replica's I/O runtime: {e}"))
}
