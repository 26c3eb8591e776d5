import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;

/**
 * Decodes single-object-encoded messages with the reference Java implementation.
 *
 * <p>Usage: {@code AvroSingleObjectCheck SCHEMA.avsc MESSAGES.hex}. For each hex line it prints
 * the schema's own CRC-64-AVRO fingerprint, the record re-encoded as plain Avro binary, and the
 * record as Java renders it, tab-separated. Decoding fails loudly if the header, fingerprint or
 * body is not what the specification says.
 */
public final class AvroSingleObjectCheck {
  public static void main(String[] args) throws Exception {
    Schema schema = new Schema.Parser().parse(Files.readString(Path.of(args[0])));
    long fingerprint = SchemaNormalization.parsingFingerprint64(schema);
    BinaryMessageDecoder<GenericRecord> decoder = new BinaryMessageDecoder<>(GenericData.get(), schema);
    GenericDatumWriter<GenericRecord> writer = new GenericDatumWriter<>(schema);
    HexFormat hex = HexFormat.of();
    List<String> lines = Files.readAllLines(Path.of(args[1]));
    for (String line : lines) {
      GenericRecord record = decoder.decode(ByteBuffer.wrap(hex.parseHex(line.strip())));
      java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
      BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(out, null);
      writer.write(record, encoder);
      encoder.flush();
      System.out.println(
          Long.toUnsignedString(fingerprint, 16) + "\t" + hex.formatHex(out.toByteArray()) + "\t" + record);
    }
  }
}
