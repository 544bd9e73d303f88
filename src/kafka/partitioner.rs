//! Kafka's default key partitioner, as the Java client computes it.
//!
//! Every Tocsin producer sets `partitioner=murmur2_random` so librdkafka places keys where
//! Java clients and Kafka Connect do; this function lets Tocsin compute the same answer
//! without producing (to read the one partition a job id lives on).

/// Kafka's `Utils.murmur2` (seed 0x9747b28c), returning the signed 32-bit hash.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner picks for a non-null key.
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    // Java: Utils.toPositive(murmur2(key)) % numPartitions, toPositive masks the sign bit.
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_values_published_with_kafkas_java_client() {
        // From Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 4] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "key {:?}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn partition_is_in_range() {
        for i in 0..10_000u32 {
            let key = format!("job-{i}");
            assert!(partition_for(key.as_bytes(), 1024) < 1024);
        }
    }
}
