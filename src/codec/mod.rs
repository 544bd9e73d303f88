//! Avro encoding of every record Tocsin puts on Kafka.
//!
//! Owns: the schemas (`schemas/*.avsc`, embedded and parsed once), the conversion of each record
//! type to and from an Avro [`Value`] (written by hand, field by field, so that schema evolution
//! is explicit), and the two framings a value can travel in:
//!
//! - single-object encoding, `C3 01` + the 8-byte little-endian CRC-64-AVRO fingerprint of the
//!   writer's schema's Parsing Canonical Form (`canonical.rs`, by the specification, so that
//!   Java's `BinaryMessageEncoder` and fastavro agree) + the Avro binary body: what Tocsin
//!   writes on its own topics;
//! - the Confluent wire format, `00` + a 4-byte big-endian schema registry id + the body: for
//!   `runs` when a schema registry is configured (the id comes from the caller).
//!
//! [`decode`] accepts both. It never panics and never allocates more than the input's size per
//! length prefix, whatever the bytes (see `binary.rs` for why we do not use `apache_avro`'s reader).
//!
//! Two paths produce the same bytes: the reference one through [`Value`] (`records.rs` +
//! `binary.rs`, also used to resolve data of earlier schema versions and to word errors), and a
//! direct one (`direct.rs`) that skips the `Value` tree on the scheduler's hot path.
//!
//! Beside Avro, [`connect`] writes Kafka Connect's JSON with schemas, for sinks without a
//! registry (`topics.serialization`).
//!
//! Must never: do I/O (no registry look-ups: a Confluent body is read with our current schema),
//! or change the bytes of an existing schema version without adding a new one.

mod binary;
mod canonical;
pub mod connect;
mod convert;
pub(crate) use convert::AvroEnum;
mod direct;
mod records;
mod schema;
#[cfg(test)]
mod tests;

use apache_avro::types::Value;
use apache_avro::Schema;

pub use schema::CompiledSchema;

/// A record type with an Avro schema and hand-written conversions to and from [`Value`].
///
/// Sealed: [`encode`] and [`decode`] also use a direct binary path (`direct.rs`) that only the
/// records of this crate implement.
pub trait AvroRecord: direct::Direct + Sized {
    /// The schema this type is written with, compiled once.
    fn compiled() -> &'static CompiledSchema;

    fn schema() -> &'static Schema {
        Self::compiled().schema()
    }

    /// The value, with record fields in schema order.
    fn to_avro(&self) -> Value;

    /// Accepts a value of the current schema (as [`decode`] produces it, or as `apache_avro`
    /// reads or resolves it).
    fn from_avro(v: Value) -> Result<Self, CodecError>;
}

/// How an encoded value is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Avro single-object encoding: `C3 01` + 8-byte little-endian schema fingerprint + body.
    SingleObject,
    /// Confluent wire format: `00` + 4-byte big-endian schema registry id + body.
    Confluent { schema_id: u32 },
}

const SINGLE_OBJECT_MARKER: [u8; 2] = [0xC3, 0x01];
const SINGLE_OBJECT_HEADER_LEN: usize = 10;
const CONFLUENT_MAGIC: u8 = 0x00;
const CONFLUENT_HEADER_LEN: usize = 5;

/// Encodes `v` with `framing`.
pub fn encode<T: AvroRecord>(v: &T, framing: &Framing) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    encode_into(v, framing, &mut out);
    out
}

/// Appends the encoding of `v` to `out`, so that a hot loop can reuse one buffer.
pub fn encode_into<T: AvroRecord>(v: &T, framing: &Framing, out: &mut Vec<u8>) {
    match framing {
        Framing::SingleObject => {
            out.extend_from_slice(&SINGLE_OBJECT_MARKER);
            out.extend_from_slice(&T::compiled().fingerprint().to_le_bytes());
        }
        Framing::Confluent { schema_id } => {
            out.push(CONFLUENT_MAGIC);
            out.extend_from_slice(&schema_id.to_be_bytes());
        }
    }
    let start = out.len();
    v.write_body(out);
    // Debug builds check the fast path against the reference one on every call.
    if cfg!(debug_assertions) {
        let value = v.to_avro();
        assert!(
            value.validate(T::schema()),
            "to_avro of {} does not match its schema: {value:?}",
            T::compiled().name()
        );
        let mut reference = Vec::new();
        binary::write_value(&value, &mut reference);
        assert_eq!(
            &out[start..],
            &reference[..],
            "direct encoding of {} differs from its value encoding",
            T::compiled().name()
        );
    }
}

/// Decodes a value in either framing. A single-object value must carry the fingerprint of our
/// schema (the specification's, or the one earlier builds wrote: see
/// [`CompiledSchema::legacy_fingerprint`]) or of one of its earlier versions, which is then
/// resolved to the current one; a Confluent body is read with our current schema.
pub fn decode<T: AvroRecord>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_with(T::compiled(), bytes)
}

/// [`decode`] against `compiled`, which tests replace with a schema that has a history.
fn decode_with<T: AvroRecord>(compiled: &CompiledSchema, bytes: &[u8]) -> Result<T, CodecError> {
    let record = compiled.name();
    let (&first, _) = bytes.split_first().ok_or(CodecError::Empty { record })?;
    match first {
        0xC3 => {
            if bytes.len() < SINGLE_OBJECT_HEADER_LEN {
                if bytes.len() >= 2 && bytes[1] != SINGLE_OBJECT_MARKER[1] {
                    return Err(unknown_framing(record, bytes));
                }
                return Err(CodecError::TruncatedHeader {
                    record,
                    framing: "single-object",
                    len: bytes.len(),
                    need: SINGLE_OBJECT_HEADER_LEN,
                });
            }
            if bytes[1] != SINGLE_OBJECT_MARKER[1] {
                return Err(unknown_framing(record, bytes));
            }
            let mut fp = [0u8; 8];
            fp.copy_from_slice(&bytes[2..SINGLE_OBJECT_HEADER_LEN]);
            let found = u64::from_le_bytes(fp);
            let body = &bytes[SINGLE_OBJECT_HEADER_LEN..];
            if compiled.is_current(found) {
                read_current(compiled, body, SINGLE_OBJECT_HEADER_LEN)
            } else if let Some(past) = compiled.past(found) {
                let value = read_body(&past.shape, record, body, SINGLE_OBJECT_HEADER_LEN)?;
                let value =
                    value
                        .resolve(compiled.schema())
                        .map_err(|source| CodecError::Resolve {
                            record,
                            fingerprint: found,
                            source: Box::new(source),
                        })?;
                T::from_avro(value)
            } else {
                Err(CodecError::FingerprintMismatch {
                    record,
                    found,
                    expected: compiled.fingerprint(),
                })
            }
        }
        CONFLUENT_MAGIC => {
            if bytes.len() < CONFLUENT_HEADER_LEN {
                return Err(CodecError::TruncatedHeader {
                    record,
                    framing: "confluent",
                    len: bytes.len(),
                    need: CONFLUENT_HEADER_LEN,
                });
            }
            read_current(
                compiled,
                &bytes[CONFLUENT_HEADER_LEN..],
                CONFLUENT_HEADER_LEN,
            )
        }
        _ => Err(unknown_framing(record, bytes)),
    }
}

fn unknown_framing(record: &'static str, bytes: &[u8]) -> CodecError {
    let found = bytes
        .iter()
        .take(2)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    CodecError::UnknownFraming { record, found }
}

/// Reads a body of the current schema: the direct path, or on any fault the value path, whose
/// error names the field and the rule (and which is the reference, should the two disagree).
fn read_current<T: AvroRecord>(
    compiled: &CompiledSchema,
    body: &[u8],
    base: usize,
) -> Result<T, CodecError> {
    let mut reader = binary::Reader::new(body, base);
    if let Ok(v) = T::read_body(&mut reader) {
        if reader.left() == 0 {
            return Ok(v);
        }
    }
    T::from_avro(read_body(compiled.shape(), compiled.name(), body, base)?)
}

fn read_body(
    shape: &binary::Shape,
    record: &'static str,
    body: &[u8],
    base: usize,
) -> Result<Value, CodecError> {
    let mut reader = binary::Reader::new(body, base);
    let value = reader.value(shape).map_err(|f| CodecError::Malformed {
        record,
        offset: f.offset,
        field: f.path(),
        problem: f.problem,
    })?;
    if reader.left() > 0 {
        return Err(CodecError::TrailingBytes {
            record,
            offset: reader.offset(),
            count: reader.left(),
        });
    }
    Ok(value)
}

/// Why bytes could not be decoded into a record.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty input for {record}: expected a single-object header (c3 01) or a confluent magic byte (00)")]
    Empty { record: &'static str },
    #[error("unknown framing of {record}: first bytes {found} are neither the single-object marker c3 01 nor the confluent magic byte 00")]
    UnknownFraming { record: &'static str, found: String },
    #[error("truncated {framing} header of {record}: {len} bytes, need {need}")]
    TruncatedHeader {
        record: &'static str,
        framing: &'static str,
        len: usize,
        need: usize,
    },
    #[error("schema fingerprint {found:016x} of the data does not match our {record} schema, fingerprint {expected:016x}, nor any earlier version of it")]
    FingerprintMismatch {
        record: &'static str,
        found: u64,
        expected: u64,
    },
    #[error("malformed {record} at byte {offset}{}: {problem}", in_field(field))]
    Malformed {
        record: &'static str,
        offset: usize,
        /// Dotted path of the field being read, empty at the top level.
        field: String,
        problem: Problem,
    },
    #[error("{count} trailing bytes after the {record} body at byte {offset}")]
    TrailingBytes {
        record: &'static str,
        offset: usize,
        count: usize,
    },
    #[error("invalid {record} field {field}: {problem}")]
    InvalidField {
        record: &'static str,
        field: &'static str,
        problem: String,
    },
    #[error("cannot resolve {record} written with schema {fingerprint:016x} to the current schema: {source}")]
    Resolve {
        record: &'static str,
        fingerprint: u64,
        #[source]
        source: Box<apache_avro::Error>,
    },
}

fn in_field(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(" (field {field})")
    }
}

/// What was wrong in an Avro body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("truncated, {needed} bytes needed, {left} left")]
    Truncated { needed: usize, left: usize },
    #[error("{what} length {len} exceeds the {left} bytes left")]
    LengthTooLarge {
        what: &'static str,
        len: u64,
        left: usize,
    },
    #[error("negative {what} length {len}")]
    NegativeLength { what: &'static str, len: i64 },
    #[error("variable-length integer longer than 10 bytes")]
    VarintTooLong,
    #[error("int {value} out of range of 32 bits")]
    IntOutOfRange { value: i64 },
    #[error("boolean byte {byte:#04x} is neither 0 nor 1")]
    InvalidBoolean { byte: u8 },
    #[error("enum index {index} out of range 0..{count} of {name}")]
    EnumIndex {
        name: String,
        index: i64,
        count: usize,
    },
    #[error("union branch {index} out of range 0..{count}")]
    UnionIndex { index: i64, count: usize },
    #[error("string is not valid utf-8")]
    InvalidUtf8,
}
