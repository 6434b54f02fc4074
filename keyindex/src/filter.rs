//! A blocked bloom filter (Putze, Sanders, Singler, "Cache-, Hash- and Space-Efficient Bloom
//! Filters"): every probe of one key lands in one 64-byte block, so a lookup costs one cache
//! miss per run however many bits it tests. It only ever says "maybe" or "no"; it owns no
//! file and never allocates after it is made.

/// Bytes in one filter block: one cache line.
pub const FILTER_BLOCK_BYTES: usize = 64;
const BLOCK_WORDS: usize = FILTER_BLOCK_BYTES / 8;
const _: () = assert!(FILTER_BLOCK_BYTES == 64);

/// Bits per key the index never goes above (about 1% false positives for a blocked filter).
pub const BITS_PER_KEY_MAX: u64 = 10;

#[derive(Debug, Clone, Default)]
pub struct Filter {
    words: Vec<u64>,
    k: u32,
}

/// The most probes a filter makes per key (what `probes_for` gives at `BITS_PER_KEY_MAX`
/// and above); a run naming more is refused at open.
pub const PROBES_MAX: u32 = 8;

/// Probes for a key at about `bits` bits per key (ln 2 times the bits, at least one).
pub fn probes_for(bits_per_key: u64) -> u32 {
    ((bits_per_key as f64 * 0.69).round() as u32).clamp(1, PROBES_MAX)
}

impl Filter {
    /// A filter of `blocks` blocks with `k` probes per key; zero blocks says "maybe" always.
    pub fn new(blocks: u64, k: u32) -> Filter {
        Filter {
            words: vec![0; blocks as usize * BLOCK_WORDS],
            k,
        }
    }

    /// The filter from its bytes (little-endian words), as stored in a run file.
    pub fn from_bytes(bytes: &[u8], k: u32) -> Filter {
        let words = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        Filter { words, k }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    pub fn blocks(&self) -> u64 {
        (self.words.len() / BLOCK_WORDS) as u64
    }

    pub fn bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// The block a hash lands in, and the probe sequence's start: the high half picks the
    /// block (a multiply-shift range reduction), the low half seeds the probes.
    fn place(&self, hash: u64) -> (usize, u64) {
        let blocks = self.blocks();
        let block = (((hash >> 32) * blocks) >> 32) as usize;
        (block * BLOCK_WORDS, hash as u32 as u64 | 1)
    }

    pub fn insert(&mut self, hash: u64) {
        if self.words.is_empty() {
            return;
        }
        let (base, mut x) = self.place(hash);
        for _ in 0..self.k {
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let bit = (x >> 55) as usize; // 0..512
            self.words[base + bit / 64] |= 1 << (bit % 64);
        }
    }

    /// False only if `hash` was never inserted.
    pub fn may_contain(&self, hash: u64) -> bool {
        if self.words.is_empty() {
            return true;
        }
        let (base, mut x) = self.place(hash);
        for _ in 0..self.k {
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let bit = (x >> 55) as usize;
            if self.words[base + bit / 64] & (1 << (bit % 64)) == 0 {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let n = 100_000u64;
        let blocks = (n * BITS_PER_KEY_MAX).div_ceil(512);
        let mut f = Filter::new(blocks, probes_for(BITS_PER_KEY_MAX));
        let h = |i: u64| crate::hash::mix(i);
        for i in 0..n {
            f.insert(h(i));
        }
        assert!((0..n).all(|i| f.may_contain(h(i))));
        let fp = (n..2 * n).filter(|i| f.may_contain(h(*i))).count();
        // A blocked filter at 10 bits per key: about 1%; 3% would be a broken probe sequence.
        assert!(fp < (n as usize) * 3 / 100, "{fp} false positives in {n}");
        let g = Filter::from_bytes(&f.to_bytes(), f.k);
        assert!((0..n).all(|i| g.may_contain(h(i))));
    }

    #[test]
    fn an_empty_filter_says_maybe() {
        assert!(Filter::new(0, 3).may_contain(42));
    }
}
