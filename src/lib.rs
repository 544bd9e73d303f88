//! Tocsin: a Kafka-native distributed job scheduler.
//!
//! The modules follow the data flow: `model` (jobs, schedules, runs; pure), `codec` (Avro),
//! `kafka` (clients, admin), `scheduler` (ownership, restore, bucket index, firing), `worker`, `history` (what `runs` and
//! `dead` carry for sinks),
//! `http` (each node's /metrics, /healthz, /readyz and /status), `telemetry` (every event's
//! log line and metric, with the metrics' names, units and buckets), `api` (the job API on
//! scheduler nodes, `/v1/`), and `cli` (the `tocsin` binary).
//!
//! Without the default feature `runtime` only `model`, `codec` and `config` build, with no
//! librdkafka or RocksDB: the fuzz targets (`fuzz/`) use that.

#[cfg(feature = "runtime")]
pub mod api;
#[cfg(feature = "runtime")]
pub mod cli;
pub mod codec;
pub mod config;
pub mod history;
#[cfg(feature = "runtime")]
pub mod http;
#[cfg(feature = "runtime")]
pub mod kafka;
pub mod model;
pub mod node;
#[cfg(feature = "runtime")]
pub mod scheduler;
#[cfg(feature = "runtime")]
pub mod telemetry;
#[cfg(feature = "runtime")]
pub mod worker;
/// Without `runtime`, only the worker's policy, whose host rules the configuration checks.
#[cfg(not(feature = "runtime"))]
pub mod worker {
    pub mod policy;
}
