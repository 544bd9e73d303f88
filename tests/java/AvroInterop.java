import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.io.JsonEncoder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * Apache Avro's own single-object encoding, for tests/avro_interop.rs. Each line of stdin is a
 * request, {@code COMMAND<TAB>SCHEMA_FILE<TAB>ARGUMENT}; each gets one line on stdout:
 *
 * <ul>
 *   <li>{@code canonical}: {@code FORM<TAB>FINGERPRINT}, the schema's Parsing Canonical Form and
 *       its CRC-64-AVRO fingerprint (SchemaNormalization), the fingerprint as unsigned hex;
 *   <li>{@code encode}: the argument, a datum in Avro's JSON encoding, written by
 *       BinaryMessageEncoder, in hex;
 *   <li>{@code decode}: the argument, single-object bytes in hex, read by BinaryMessageDecoder
 *       (which refuses a fingerprint it does not know), in Avro's JSON encoding.
 * </ul>
 *
 * A request that fails answers {@code error: MESSAGE}.
 */
public class AvroInterop {
    public static void main(String[] args) throws Exception {
        Map<String, Schema> schemas = new HashMap<>();
        HexFormat hex = HexFormat.of();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.split("\t", 3);
            try {
                Schema schema = schemas.get(parts[1]);
                if (schema == null) {
                    schema = new Schema.Parser().parse(new File(parts[1]));
                    schemas.put(parts[1], schema);
                }
                switch (parts[0]) {
                    case "canonical" -> {
                        long fp = SchemaNormalization.parsingFingerprint64(schema);
                        out.append(SchemaNormalization.toParsingForm(schema))
                            .append('\t')
                            .append(Long.toHexString(fp));
                    }
                    case "encode" -> {
                        GenericDatumReader<GenericRecord> reader = new GenericDatumReader<>(schema);
                        GenericRecord datum = reader.read(null, DecoderFactory.get().jsonDecoder(schema, parts[2]));
                        ByteBuffer bytes = new BinaryMessageEncoder<GenericRecord>(GenericData.get(), schema).encode(datum);
                        byte[] array = new byte[bytes.remaining()];
                        bytes.get(array);
                        out.append(hex.formatHex(array));
                    }
                    case "decode" -> {
                        GenericRecord datum = new BinaryMessageDecoder<GenericRecord>(GenericData.get(), schema)
                            .decode(hex.parseHex(parts[2]));
                        ByteArrayOutputStream json = new ByteArrayOutputStream();
                        JsonEncoder encoder = EncoderFactory.get().jsonEncoder(schema, json);
                        new GenericDatumWriter<GenericRecord>(schema).write(datum, encoder);
                        encoder.flush();
                        out.append(json.toString(StandardCharsets.UTF_8).replace("\n", " "));
                    }
                    default -> throw new IllegalArgumentException("unknown command " + parts[0]);
                }
            } catch (Exception e) {
                out.append("error: ").append(String.valueOf(e).replace("\n", " "));
            }
            out.append('\n');
        }
        System.out.print(out);
    }
}
