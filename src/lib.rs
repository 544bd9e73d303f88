//! Tocsin: a Kafka-native distributed job scheduler.
//!
//! The modules follow the data flow: `model` (jobs, schedules, runs; pure), `codec` (Avro),
//! `kafka` (clients, admin), `scheduler` (ownership, restore, bucket index, firing), `worker`,
//! `http` (each node's /metrics, /healthz, /readyz and /status), and `cli` (the `tocsin` binary).

pub mod cli;
pub mod codec;
pub mod config;
pub mod http;
pub mod kafka;
pub mod model;
pub mod scheduler;
pub mod worker;
