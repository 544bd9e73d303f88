"""fastavro's side of tests/avro_interop.rs, the twin of tests/java/AvroInterop.java.

Each line of stdin is a request, COMMAND<TAB>SCHEMA_FILE<TAB>ARGUMENT; each gets one line on
stdout:

- canonical: FORM<TAB>FINGERPRINT, fastavro's Parsing Canonical Form of the schema and its
  CRC-64-AVRO fingerprint, the fingerprint as unsigned hex;
- encode: the argument, a datum in Avro's JSON encoding, as single-object bytes in hex: C3 01,
  the fingerprint in little-endian order, and the body by fastavro's schemaless_writer (fastavro
  has no single-object writer of its own: this is the framing the specification gives);
- decode: the argument, single-object bytes in hex, checked against the fingerprint and read by
  schemaless_reader, in Avro's JSON encoding.

A request that fails answers "error: MESSAGE".
"""

import io
import json
import sys

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

MARKER = b"\xc3\x01"


SCHEMAS = {}


def load(path):
    if path not in SCHEMAS:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        form = to_parsing_canonical_form(schema)
        # fastavro gives the fingerprint's bytes in little-endian order, as the header wants.
        header = MARKER + bytes.fromhex(fingerprint(form, "CRC-64-AVRO"))
        SCHEMAS[path] = (fastavro.parse_schema(schema), form, header)
    return SCHEMAS[path]


def answer(command, path, argument):
    schema, form, header = load(path)
    if command == "canonical":
        value = int.from_bytes(header[2:], "little")
        return f"{form}\t{value:x}"
    if command == "encode":
        (datum,) = list(fastavro.json_reader(io.StringIO(argument), schema))
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, schema, datum)
        return out.getvalue().hex()
    if command == "decode":
        data = bytes.fromhex(argument)
        if data[:10] != header:
            raise ValueError(f"header {data[:10].hex()} is not {header.hex()}")
        body = io.BytesIO(data[10:])
        datum = fastavro.schemaless_reader(body, schema, None)
        if body.read():
            raise ValueError("trailing bytes after the body")
        out = io.StringIO()
        fastavro.json_writer(out, schema, [datum])
        return out.getvalue().strip().replace("\n", " ")
    raise ValueError(f"unknown command {command}")


def main():
    for line in sys.stdin:
        command, path, argument = line.rstrip("\n").split("\t", 2)
        try:
            print(answer(command, path, argument))
        except Exception as e:  # noqa: BLE001 - every failure is an answer
            print(f"error: {type(e).__name__}: {e}".replace("\n", " "))


if __name__ == "__main__":
    main()
