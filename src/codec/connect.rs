//! Kafka Connect's JSON with schemas, as `JsonConverter` with `schemas.enable=true` reads it:
//! `{"schema": {…}, "payload": {…}}`, one flat struct per record, so that a stock Connect
//! sink (the Debezium JDBC sink) can write it without a schema registry.
//!
//! Owns: the envelope of a flat struct and the reading of one back. Instants are `int64` named
//! `org.apache.kafka.connect.data.Timestamp` (version 1, epoch milliseconds), as Connect's
//! `Timestamp` logical type is; optional fields say `"optional": true` and carry `null` when
//! absent. Must never: nest structs (JDBC sinks want flat rows) or do I/O.

use serde_json::{json, Map, Value};

/// The name Connect gives its timestamp logical type.
pub const TIMESTAMP: &str = "org.apache.kafka.connect.data.Timestamp";

/// The Connect type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    String,
    Int32,
    Int64,
    /// Epoch milliseconds, as Connect's `Timestamp`.
    Timestamp,
}

/// One field of a flat struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub ty: FieldType,
    pub optional: bool,
}

impl Field {
    pub const fn required(name: &'static str, ty: FieldType) -> Field {
        Field {
            name,
            ty,
            optional: false,
        }
    }

    pub const fn optional(name: &'static str, ty: FieldType) -> Field {
        Field {
            name,
            ty,
            optional: true,
        }
    }

    fn schema(&self) -> Value {
        let mut s = Map::new();
        let ty = match self.ty {
            FieldType::String => "string",
            FieldType::Int32 => "int32",
            FieldType::Int64 | FieldType::Timestamp => "int64",
        };
        s.insert("type".into(), ty.into());
        s.insert("optional".into(), self.optional.into());
        if self.ty == FieldType::Timestamp {
            s.insert("name".into(), TIMESTAMP.into());
            s.insert("version".into(), 1.into());
        }
        s.insert("field".into(), self.name.into());
        Value::Object(s)
    }
}

/// A value of a field; `Null` only for optional fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datum {
    Str(String),
    Int(i64),
    Null,
}

impl From<&str> for Datum {
    fn from(s: &str) -> Datum {
        Datum::Str(s.to_owned())
    }
}

impl From<Option<&str>> for Datum {
    fn from(s: Option<&str>) -> Datum {
        s.map_or(Datum::Null, Datum::from)
    }
}

impl From<i64> for Datum {
    fn from(n: i64) -> Datum {
        Datum::Int(n)
    }
}

impl From<Option<i64>> for Datum {
    fn from(n: Option<i64>) -> Datum {
        n.map_or(Datum::Null, Datum::Int)
    }
}

/// Why a record is not the Connect JSON struct expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    #[error("{record} is not JSON: {reason}")]
    NotJson {
        record: &'static str,
        reason: String,
    },
    #[error("{record} has no {part:?} object: Connect JSON with schemas is {{\"schema\": …, \"payload\": …}}")]
    NoEnvelope {
        record: &'static str,
        part: &'static str,
    },
    #[error("{record} field {field}: {problem}")]
    Field {
        record: &'static str,
        field: &'static str,
        problem: String,
    },
}

/// The schema of a flat struct named `name` (Connect's `schema.name`, e.g. `io.tocsin.RunRow`).
pub fn schema(name: &str, fields: &[Field]) -> Value {
    json!({
        "type": "struct",
        "name": name,
        "optional": false,
        "fields": fields.iter().map(Field::schema).collect::<Vec<_>>(),
    })
}

/// The envelope of one struct. `values` are in the order of `fields`.
///
/// Panics when the two disagree (a bug of the caller, which builds both from one table).
pub fn envelope(name: &str, fields: &[Field], values: Vec<Datum>) -> Vec<u8> {
    assert_eq!(fields.len(), values.len(), "fields and values of {name}");
    let mut payload = Map::new();
    for (f, v) in fields.iter().zip(values) {
        let v = match v {
            Datum::Str(s) => {
                assert_eq!(f.ty, FieldType::String, "{name}.{}", f.name);
                Value::String(s)
            }
            Datum::Int(n) => {
                assert_ne!(f.ty, FieldType::String, "{name}.{}", f.name);
                Value::from(n)
            }
            Datum::Null => {
                assert!(f.optional, "{name}.{} is required", f.name);
                Value::Null
            }
        };
        payload.insert(f.name.into(), v);
    }
    let doc = json!({ "schema": schema(name, fields), "payload": payload });
    serde_json::to_vec(&doc).expect("a JSON value serializes")
}

/// The payload of an envelope, checked against `fields`: each present with its type, `null`
/// only where optional. Other payload fields are ignored (a newer writer may add some).
pub fn payload(
    record: &'static str,
    fields: &[Field],
    bytes: &[u8],
) -> Result<Map<String, Value>, ConnectError> {
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| ConnectError::NotJson {
        record,
        reason: e.to_string(),
    })?;
    if !doc.get("schema").is_some_and(Value::is_object) {
        return Err(ConnectError::NoEnvelope {
            record,
            part: "schema",
        });
    }
    let Some(Value::Object(payload)) = doc.get("payload") else {
        return Err(ConnectError::NoEnvelope {
            record,
            part: "payload",
        });
    };
    for f in fields {
        let problem = match (payload.get(f.name), f.ty) {
            (None, _) if f.optional => continue,
            (None, _) => "missing".to_owned(),
            (Some(Value::Null), _) if f.optional => continue,
            (Some(Value::Null), _) => "null, but the field is required".to_owned(),
            (Some(Value::String(_)), FieldType::String) => continue,
            (Some(v), FieldType::Int32) if v.as_i64().is_some_and(|n| i32::try_from(n).is_ok()) => {
                continue
            }
            (Some(v), FieldType::Int64 | FieldType::Timestamp) if v.is_i64() => continue,
            (Some(v), ty) => format!("{v} is not {}", type_name(ty)),
        };
        return Err(ConnectError::Field {
            record,
            field: f.name,
            problem,
        });
    }
    Ok(payload.clone())
}

fn type_name(ty: FieldType) -> &'static str {
    match ty {
        FieldType::String => "a string",
        FieldType::Int32 => "a 32-bit integer",
        FieldType::Int64 => "a 64-bit integer",
        FieldType::Timestamp => "epoch milliseconds (a 64-bit integer)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: [Field; 4] = [
        Field::required("id", FieldType::String),
        Field::required("attempt", FieldType::Int32),
        Field::optional("at", FieldType::Timestamp),
        Field::optional("note", FieldType::String),
    ];

    #[test]
    fn the_envelope_is_what_json_converter_reads() {
        let bytes = envelope(
            "io.tocsin.Test",
            &FIELDS,
            vec![
                "r1".into(),
                3i64.into(),
                Some(1_700_000_000_123).into(),
                Datum::Null,
            ],
        );
        let doc: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            doc,
            json!({
                "schema": {
                    "type": "struct", "name": "io.tocsin.Test", "optional": false,
                    "fields": [
                        {"type": "string", "optional": false, "field": "id"},
                        {"type": "int32", "optional": false, "field": "attempt"},
                        {"type": "int64", "optional": true, "name": TIMESTAMP, "version": 1, "field": "at"},
                        {"type": "string", "optional": true, "field": "note"},
                    ]
                },
                "payload": {"id": "r1", "attempt": 3, "at": 1_700_000_000_123i64, "note": null}
            })
        );
        let p = payload("test", &FIELDS, &bytes).unwrap();
        assert_eq!(p["at"], 1_700_000_000_123i64);
    }

    #[test]
    fn a_payload_that_breaks_its_fields_is_refused_naming_the_field() {
        let cases: [(&str, &str); 5] = [
            ("not json", "is not JSON"),
            (r#"{"payload": {}}"#, "no \"schema\" object"),
            (
                r#"{"schema": {}, "payload": {"attempt": 1}}"#,
                "field id: missing",
            ),
            (
                r#"{"schema": {}, "payload": {"id": null, "attempt": 1}}"#,
                "field id: null, but the field is required",
            ),
            (
                r#"{"schema": {}, "payload": {"id": "r", "attempt": 4294967296}}"#,
                "field attempt: 4294967296 is not a 32-bit integer",
            ),
        ];
        for (input, want) in cases {
            let err = payload("test", &FIELDS, input.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
    }

    #[test]
    #[should_panic(expected = "is required")]
    fn a_null_in_a_required_field_is_a_bug_of_the_caller() {
        envelope(
            "io.tocsin.Test",
            &FIELDS,
            vec![Datum::Null, 1i64.into(), Datum::Null, Datum::Null],
        );
    }
}
