//! The embedded schemas (`schemas/*.avsc`), parsed and compiled once per process.

use std::sync::LazyLock;

use apache_avro::rabin::Rabin;
use apache_avro::Schema;

use super::binary::Shape;

/// A record schema ready for use: parsed, fingerprinted and compiled for reading.
#[derive(Debug)]
pub struct CompiledSchema {
    name: &'static str,
    schema: Schema,
    fingerprint: u64,
    shape: Shape,
    /// Earlier versions of the schema, still readable from single-object data.
    history: Vec<PastSchema>,
}

#[derive(Debug)]
pub(crate) struct PastSchema {
    pub(crate) fingerprint: u64,
    pub(crate) shape: Shape,
}

impl CompiledSchema {
    /// Parses `json` as the current schema and each of `history` as an earlier version.
    ///
    /// Panics when a schema does not parse: the embedded schemas are constants of the build,
    /// and `every_embedded_schema_compiles` fails on such a build before it can ship.
    pub(crate) fn new(name: &'static str, json: &str, history: &[&str]) -> Self {
        let (schema, fingerprint, shape) = parse(name, json);
        let history = history
            .iter()
            .map(|json| {
                let (_, fingerprint, shape) = parse(name, json);
                PastSchema { fingerprint, shape }
            })
            .collect();
        CompiledSchema {
            name,
            schema,
            fingerprint,
            shape,
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

    /// CRC-64-AVRO (Rabin) fingerprint of the schema's parsing canonical form, as the
    /// single-object header carries it (little-endian).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    pub(crate) fn past(&self, fingerprint: u64) -> Option<&PastSchema> {
        self.history.iter().find(|p| p.fingerprint == fingerprint)
    }
}

fn parse(name: &str, json: &str) -> (Schema, u64, Shape) {
    let schema = Schema::parse_str(json)
        .unwrap_or_else(|e| panic!("embedded avro schema of {name} does not parse: {e}"));
    let bytes = schema.fingerprint::<Rabin>().bytes;
    let fingerprint = u64::from_le_bytes(
        bytes
            .try_into()
            .unwrap_or_else(|_| panic!("rabin fingerprint of {name} is not 8 bytes")),
    );
    let shape = Shape::compile(&schema)
        .unwrap_or_else(|e| panic!("embedded avro schema of {name} does not compile: {e}"));
    (schema, fingerprint, shape)
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
