import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.common.utils.Utils;

/** Prints, for each key on stdin, the partition Kafka's default partitioner picks. */
public class Murmur2 {
    public static void main(String[] args) throws Exception {
        int partitions = Integer.parseInt(args[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            byte[] key = line.getBytes(StandardCharsets.UTF_8);
            out.append(Utils.toPositive(Utils.murmur2(key)) % partitions).append('\n');
        }
        System.out.print(out);
    }
}
