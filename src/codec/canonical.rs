//! The Parsing Canonical Form of a schema and its CRC-64-AVRO fingerprint, as the Avro
//! specification defines them ("Parsing Canonical Form for Schemas", "Schema Fingerprints"):
//! what a single-object header carries, and what Java's `SchemaNormalization` and
//! `BinaryMessageEncoder`, fastavro and every other conforming library compute.
//!
//! Written here rather than taken from `apache_avro`: its 0.22 keeps a primitive with a
//! `logicalType` as `{"type":"long"}` where the specification strips it to `"long"` (AVRO-4004),
//! so its fingerprints match no other library's for our schemas, all of which have instants.
//! Tocsin wrote those fingerprints before; [`Form::ApacheAvro022`] reproduces them so that such
//! data is still read.
//!
//! Pure: works on the schema's JSON, does no I/O.

use std::collections::HashSet;

use serde_json::Value as Json;

/// Which canonical form to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// The specification's.
    Spec,
    /// `apache_avro` 0.22's: the specification's, except that a primitive type with other
    /// attributes (a logical type) stays an object, `{"type":"long"}`.
    ApacheAvro022,
}

/// Why a schema's JSON has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    #[error("{what} at {path} is not a schema: {found}")]
    NotASchema {
        what: &'static str,
        path: String,
        found: String,
    },
    #[error("{kind} at {path} has no valid {attribute:?}")]
    MissingAttribute {
        kind: String,
        attribute: &'static str,
        path: String,
    },
}

const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// The Parsing Canonical Form of `schema` (its JSON).
pub(crate) fn canonical_form(schema: &Json, form: Form) -> Result<String, CanonicalError> {
    let mut writer = Writer {
        form,
        defined: HashSet::new(),
        out: String::with_capacity(1024),
    };
    writer.schema(schema, "", "$")?;
    Ok(writer.out)
}

struct Writer {
    form: Form,
    /// Full names of the named types written so far: a later use is written as the name alone.
    defined: HashSet<String>,
    out: String,
}

impl Writer {
    /// Writes `s`, found at `path`, whose enclosing namespace is `ns` ("" for none).
    fn schema(&mut self, s: &Json, ns: &str, path: &str) -> Result<(), CanonicalError> {
        match s {
            Json::String(name) => {
                if PRIMITIVES.contains(&name.as_str()) {
                    self.string(name);
                } else {
                    let full = self.resolve(name, ns);
                    self.string(&full);
                }
                Ok(())
            }
            Json::Array(branches) => {
                self.list(branches, |w, i, b| w.schema(b, ns, &format!("{path}[{i}]")))
            }
            Json::Object(o) => {
                let kind = match o.get("type") {
                    Some(Json::String(kind)) => kind.as_str(),
                    // `{"type": {...}}` or `{"type": [...]}`: the inner schema is the schema.
                    Some(inner @ (Json::Object(_) | Json::Array(_))) => {
                        return self.schema(inner, ns, &format!("{path}.type"));
                    }
                    _ => return Err(missing("schema object", "type", path)),
                };
                match kind {
                    k if PRIMITIVES.contains(&k) => {
                        // [PRIMITIVES] and [STRIP]: a primitive with a logical type (or any other
                        // attribute) is the primitive's name.
                        if self.form == Form::ApacheAvro022 && o.len() > 1 {
                            self.out.push_str("{\"type\":");
                            self.string(k);
                            self.out.push('}');
                        } else {
                            self.string(k);
                        }
                        Ok(())
                    }
                    "array" => self.container(o, "array", "items", ns, path),
                    "map" => self.container(o, "map", "values", ns, path),
                    "record" | "error" | "enum" | "fixed" => self.named(o, kind, ns, path),
                    // `{"type": "io.tocsin.FireReason"}`: a reference to a named type.
                    name => {
                        let full = self.resolve(name, ns);
                        self.string(&full);
                        Ok(())
                    }
                }
            }
            other => Err(CanonicalError::NotASchema {
                what: "value",
                path: path.into(),
                found: other.to_string(),
            }),
        }
    }

    fn container(
        &mut self,
        o: &serde_json::Map<String, Json>,
        kind: &str,
        attribute: &'static str,
        ns: &str,
        path: &str,
    ) -> Result<(), CanonicalError> {
        let inner = o
            .get(attribute)
            .ok_or_else(|| missing(kind, attribute, path))?;
        self.out.push_str("{\"type\":");
        self.string(kind);
        self.out.push(',');
        self.string(attribute);
        self.out.push(':');
        self.schema(inner, ns, &format!("{path}.{attribute}"))?;
        self.out.push('}');
        Ok(())
    }

    fn named(
        &mut self,
        o: &serde_json::Map<String, Json>,
        kind: &str,
        ns: &str,
        path: &str,
    ) -> Result<(), CanonicalError> {
        let missing_here = |attribute| missing(kind, attribute, path);
        let array = |attribute| {
            o.get(attribute)
                .and_then(Json::as_array)
                .ok_or_else(|| missing_here(attribute))
        };
        let name = required_str(o.get("name"), kind, "name", path)?;
        // [FULLNAMES]: a dotted name is a full name; else the type's own namespace, else the
        // enclosing one. Its namespace then encloses what it defines.
        let (full, own_ns) = match name.rsplit_once('.') {
            Some((space, _)) => (name.to_owned(), space.to_owned()),
            None => {
                let space = match o.get("namespace") {
                    Some(Json::String(space)) => space.as_str(),
                    _ => ns,
                };
                (qualify(space, name), space.to_owned())
            }
        };
        if !self.defined.insert(full.clone()) {
            self.string(&full);
            return Ok(());
        }
        // [ORDER]: name, type, then fields, symbols or size.
        self.out.push_str("{\"name\":");
        self.string(&full);
        self.out.push_str(",\"type\":");
        // An error is a record to a reader (and to Java's SchemaNormalization).
        self.string(if kind == "error" { "record" } else { kind });
        match kind {
            "enum" => {
                let symbols = array("symbols")?;
                self.out.push_str(",\"symbols\":");
                self.list(symbols, |w, _, s| {
                    w.string(s.as_str().ok_or_else(|| missing_here("symbols"))?);
                    Ok(())
                })?;
            }
            "fixed" => {
                // [INTEGERS]: no quotes, no leading zeros.
                let size = match o.get("size") {
                    Some(Json::Number(n)) => n.as_u64(),
                    Some(Json::String(s)) => s.parse::<u64>().ok(),
                    _ => None,
                }
                .ok_or_else(|| missing_here("size"))?;
                self.out.push_str(",\"size\":");
                self.out.push_str(&size.to_string());
            }
            _ => {
                let fields = array("fields")?;
                self.out.push_str(",\"fields\":");
                self.list(fields, |w, i, f| {
                    let field_path = format!("{path}.fields[{i}]");
                    let field_name = required_str(f.get("name"), "field", "name", &field_path)?;
                    let field_type = f
                        .get("type")
                        .ok_or_else(|| missing("field", "type", &field_path))?;
                    w.out.push_str("{\"name\":");
                    w.string(field_name);
                    w.out.push_str(",\"type\":");
                    w.schema(field_type, &own_ns, &format!("{field_path}.type"))?;
                    w.out.push('}');
                    Ok(())
                })?;
            }
        }
        self.out.push('}');
        Ok(())
    }

    /// Writes `items` as a JSON array, each by `each` (given its index).
    fn list(
        &mut self,
        items: &[Json],
        mut each: impl FnMut(&mut Self, usize, &Json) -> Result<(), CanonicalError>,
    ) -> Result<(), CanonicalError> {
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            each(self, i, item)?;
        }
        self.out.push(']');
        Ok(())
    }

    /// The full name a reference stands for: a dotted name as it is; a short name in the
    /// enclosing namespace, or, when no type of that full name was defined but one of the short
    /// name in no namespace was, that one (as Java resolves it).
    fn resolve(&self, name: &str, ns: &str) -> String {
        if name.contains('.') || ns.is_empty() {
            return name.to_owned();
        }
        let full = qualify(ns, name);
        if !self.defined.contains(&full) && self.defined.contains(name) {
            return name.to_owned();
        }
        full
    }

    /// [STRINGS]: a JSON string with only the escapes JSON requires (names and symbols, being
    /// `[A-Za-z_][A-Za-z0-9_]*`, need none).
    fn string(&mut self, s: &str) {
        self.out
            .push_str(&serde_json::to_string(s).expect("a string serializes"));
    }
}

fn missing(kind: &str, attribute: &'static str, path: &str) -> CanonicalError {
    CanonicalError::MissingAttribute {
        kind: kind.into(),
        attribute,
        path: path.into(),
    }
}

fn required_str<'j>(
    value: Option<&'j Json>,
    kind: &str,
    attribute: &'static str,
    path: &str,
) -> Result<&'j str, CanonicalError> {
    value
        .and_then(Json::as_str)
        .ok_or_else(|| missing(kind, attribute, path))
}

fn qualify(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}.{name}")
    }
}

/// CRC-64-AVRO of `bytes`: the 64-bit Rabin fingerprint the specification gives in full
/// ("Schema Fingerprints"), with its empty value `0xc15d213aa4d7a795`.
pub(crate) fn crc64_avro(bytes: &[u8]) -> u64 {
    let mut fp = EMPTY;
    for &b in bytes {
        fp = (fp >> 8) ^ TABLE[((fp ^ u64::from(b)) & 0xff) as usize];
    }
    fp
}

const EMPTY: u64 = 0xc15d_213a_a4d7_a795;

static TABLE: [u64; 256] = table();

const fn table() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut fp = i as u64;
        let mut j = 0;
        while j < 8 {
            fp = (fp >> 1) ^ (EMPTY & (0u64.wrapping_sub(fp & 1)));
            j += 1;
        }
        table[i] = fp;
        i += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> String {
        canonical_form(&serde_json::from_str(json).unwrap(), Form::Spec).unwrap()
    }

    #[test]
    fn crc64_avro_matches_the_specifications_vector() {
        // The specification's example: "null" fingerprints to 7195948357588979594. (Every
        // embedded schema's form is also checked against apache_avro's Rabin digest, and against
        // Java's and fastavro's fingerprints in tests/avro_interop.rs.)
        assert_eq!(crc64_avro(b""), EMPTY);
        assert_eq!(crc64_avro(b"\"null\"") as i64, 7_195_948_357_588_979_594);
    }

    #[test]
    fn primitives_lose_their_attributes_and_logical_types() {
        assert_eq!(spec(r#""int""#), r#""int""#);
        assert_eq!(spec(r#"{"type":"int"}"#), r#""int""#);
        assert_eq!(
            spec(r#"{"type":"long","logicalType":"timestamp-millis"}"#),
            r#""long""#
        );
        let json = serde_json::from_str(r#"{"type":"long","logicalType":"timestamp-millis"}"#);
        assert_eq!(
            canonical_form(&json.unwrap(), Form::ApacheAvro022).unwrap(),
            r#"{"type":"long"}"#
        );
    }

    #[test]
    fn named_types_get_full_names_order_and_no_docs() {
        let form = spec(
            r#"{"doc":"d","fields":[
                {"type":{"type":"enum","symbols":["A","B"],"name":"E","doc":"x","default":"A"},
                 "name":"e","default":"A"},
                {"name":"again","type":"E","aliases":["old"]},
                {"name":"f","type":{"name":"other.F","type":"fixed","size":"016"}},
                {"name":"g","type":{"type":"record","name":"G","namespace":"",
                    "fields":[{"name":"h","type":{"type":"array","items":"other.F"}}]}},
                {"name":"m","type":{"type":"map","values":["null","io.x.E"]}}
              ],"type":"record","name":"R","namespace":"io.x"}"#,
        );
        assert_eq!(
            form,
            concat!(
                r#"{"name":"io.x.R","type":"record","fields":["#,
                r#"{"name":"e","type":{"name":"io.x.E","type":"enum","symbols":["A","B"]}},"#,
                r#"{"name":"again","type":"io.x.E"},"#,
                r#"{"name":"f","type":{"name":"other.F","type":"fixed","size":16}},"#,
                r#"{"name":"g","type":{"name":"G","type":"record","fields":["#,
                r#"{"name":"h","type":{"type":"array","items":"other.F"}}]}},"#,
                r#"{"name":"m","type":{"type":"map","values":["null","io.x.E"]}}]}"#
            )
        );
    }

    #[test]
    fn what_is_not_a_schema_is_refused_with_its_place() {
        let err = canonical_form(
            &serde_json::from_str(r#"{"type":"record","name":"R","fields":[{"name":"a"}]}"#)
                .unwrap(),
            Form::Spec,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "field at $.fields[0] has no valid \"type\""
        );
        let err = canonical_form(&serde_json::json!(3), Form::Spec).unwrap_err();
        assert_eq!(err.to_string(), "value at $ is not a schema: 3");
    }
}
