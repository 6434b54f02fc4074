//! The key hash the index sorts and filters by: SipHash-2-4 under a per-index secret seed
//! (`SEED`), so a client cannot choose keys that collide and turn one lookup into many reads.
//! The algorithm and seed are part of the on-disk format: a run is sorted by them.

#[allow(deprecated)]
use std::hash::{Hasher, SipHasher};

/// The 64-bit hash of `key` under `seed`.
pub fn key_hash(seed: (u64, u64), key: &[u8]) -> u64 {
    #[allow(deprecated)]
    let mut h = SipHasher::new_with_keys(seed.0, seed.1);
    h.write(key);
    h.finish()
}

/// A well-mixed 64-bit value from `x` (MurmurHash3's finaliser), for tests and for seeding.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_hash_is_stable_and_keyed() {
        // Pinned: a run on disk is sorted by this function; it must never change.
        assert_eq!(
            super::key_hash((0, 0), b"order-17"),
            super::key_hash((0, 0), b"order-17")
        );
        assert_ne!(
            super::key_hash((0, 0), b"order-17"),
            super::key_hash((1, 0), b"order-17")
        );
        // SipHash-2-4's reference vector: key 00..0f, empty message.
        let k = (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);
        assert_eq!(super::key_hash(k, b""), 0x726f_db47_dd0e_0e31);
        assert_eq!(super::key_hash((1, 2), b"abc"), 15_085_598_991_770_005_917);
    }
}
