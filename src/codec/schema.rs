//! The embedded schemas (`schemas/*.avsc`), parsed and compiled once per process.

use std::sync::LazyLock;

use apache_avro::Schema;

use super::binary::Shape;
use super::canonical::{canonical_form, crc64_avro, Form};

/// A record schema ready for use: parsed, fingerprinted and compiled for reading.
#[derive(Debug)]
pub struct CompiledSchema {
    name: &'static str,
    schema: Schema,
    canonical_form: String,
    fingerprint: u64,
    legacy_fingerprint: u64,
    shape: Shape,
    /// Earlier versions of the schema, still readable from single-object data.
    history: Vec<PastSchema>,
}

#[derive(Debug)]
pub(crate) struct PastSchema {
    pub(crate) fingerprint: u64,
    pub(crate) legacy_fingerprint: u64,
    pub(crate) shape: Shape,
}

impl CompiledSchema {
    /// Parses `json` as the current schema and each of `history` as an earlier version.
    ///
    /// Panics when a schema does not parse: the embedded schemas are constants of the build,
    /// and `every_embedded_schema_compiles` fails on such a build before it can ship.
    pub(crate) fn new(name: &'static str, json: &str, history: &[&str]) -> Self {
        let current = parse(name, json);
        let history = history
            .iter()
            .map(|json| {
                let past = parse(name, json);
                PastSchema {
                    fingerprint: past.fingerprint,
                    legacy_fingerprint: past.legacy_fingerprint,
                    shape: past.shape,
                }
            })
            .collect();
        CompiledSchema {
            name,
            schema: current.schema,
            canonical_form: current.canonical_form,
            fingerprint: current.fingerprint,
            legacy_fingerprint: current.legacy_fingerprint,
            shape: current.shape,
            history,
        }
    }

    /// The full name of the record, e.g. `io.tocsin.Run`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The schema's Parsing Canonical Form, as the Avro specification defines it (and Java's
    /// `SchemaNormalization.toParsingForm` and fastavro's `to_parsing_canonical_form` write it).
    pub fn canonical_form(&self) -> &str {
        &self.canonical_form
    }

    /// CRC-64-AVRO (Rabin) fingerprint of [`Self::canonical_form`]: what Tocsin writes in a
    /// single-object header (little-endian), and what stock Avro libraries write and expect.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The fingerprint Tocsin wrote before it computed the specification's: `apache_avro`
    /// 0.22's, of a canonical form that keeps a logical-typed primitive as `{"type":"long"}`
    /// (AVRO-4004). Still accepted on reading, as the current schema, so that records on the
    /// compacted topics written by earlier builds stay readable; never written.
    pub fn legacy_fingerprint(&self) -> u64 {
        self.legacy_fingerprint
    }

    /// Whether single-object data with `fingerprint` was written with the current schema.
    pub(crate) fn is_current(&self, fingerprint: u64) -> bool {
        fingerprint == self.fingerprint || fingerprint == self.legacy_fingerprint
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    pub(crate) fn past(&self, fingerprint: u64) -> Option<&PastSchema> {
        self.history
            .iter()
            .find(|p| p.fingerprint == fingerprint || p.legacy_fingerprint == fingerprint)
    }
}

struct Parsed {
    schema: Schema,
    canonical_form: String,
    fingerprint: u64,
    legacy_fingerprint: u64,
    shape: Shape,
}

fn parse(name: &str, json: &str) -> Parsed {
    let schema = Schema::parse_str(json)
        .unwrap_or_else(|e| panic!("embedded avro schema of {name} does not parse: {e}"));
    let form = |form| {
        let json: serde_json::Value = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("embedded avro schema of {name} is not json: {e}"));
        canonical_form(&json, form)
            .unwrap_or_else(|e| panic!("embedded avro schema of {name} has no canonical form: {e}"))
    };
    let canonical_form = form(Form::Spec);
    let fingerprint = crc64_avro(canonical_form.as_bytes());
    let legacy_fingerprint = crc64_avro(form(Form::ApacheAvro022).as_bytes());
    let shape = Shape::compile(&schema)
        .unwrap_or_else(|e| panic!("embedded avro schema of {name} does not compile: {e}"));
    Parsed {
        schema,
        canonical_form,
        fingerprint,
        legacy_fingerprint,
        shape,
    }
}

// When a schema changes, keep its previous text as `schemas/history/<Name>.v<N>.avsc` and list
// it here, so that single-object records written with it (the compacted topics keep them for
// ever) are still read, resolved to the current schema. See `schemas/README.md`.
pub(crate) static JOB_DEFINITION: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::new(
        "io.tocsin.JobDefinition",
        include_str!("../../schemas/JobDefinition.avsc"),
        &[],
    )
});

pub(crate) static TIMER_STATE: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::new(
        "io.tocsin.TimerState",
        include_str!("../../schemas/TimerState.avsc"),
        &[],
    )
});

pub(crate) static CONTROL_RECORD: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::new(
        "io.tocsin.ControlRecord",
        include_str!("../../schemas/ControlRecord.avsc"),
        &[],
    )
});

pub(crate) static RUN: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::new("io.tocsin.Run", include_str!("../../schemas/Run.avsc"), &[])
});

pub(crate) static RUN_EVENT: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::new(
        "io.tocsin.RunEvent",
        include_str!("../../schemas/RunEvent.avsc"),
        &[],
    )
});

pub(crate) static DEAD_LETTER: LazyLock<CompiledSchema> = LazyLock::new(|| {
    CompiledSchema::new(
        "io.tocsin.DeadLetter",
        include_str!("../../schemas/DeadLetter.avsc"),
        &[],
    )
});

/// Every embedded schema, with the file it comes from, for tests.
#[cfg(test)]
pub(crate) fn all() -> [(&'static str, &'static str, &'static CompiledSchema); 6] {
    [
        (
            "JobDefinition.avsc",
            include_str!("../../schemas/JobDefinition.avsc"),
            &JOB_DEFINITION,
        ),
        (
            "TimerState.avsc",
            include_str!("../../schemas/TimerState.avsc"),
            &TIMER_STATE,
        ),
        (
            "ControlRecord.avsc",
            include_str!("../../schemas/ControlRecord.avsc"),
            &CONTROL_RECORD,
        ),
        ("Run.avsc", include_str!("../../schemas/Run.avsc"), &RUN),
        (
            "RunEvent.avsc",
            include_str!("../../schemas/RunEvent.avsc"),
            &RUN_EVENT,
        ),
        (
            "DeadLetter.avsc",
            include_str!("../../schemas/DeadLetter.avsc"),
            &DEAD_LETTER,
        ),
    ]
}
