//! The WAL's and the key table's payloads (the daemon's bincode records, `pipeline::records`):
//! any bytes decode to a record or an error, never a panic or a forged-length allocation;
//! a decoded record re-encodes to bytes that decode equal. The first byte picks the type.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost::pipeline::records::{
    decode, decode_wal_parts, encode, AuditRecord, ClaimRecord, DoneRecord, KeyRecord,
    RejectedRecord,
};

fn round_trip<T>(what: &'static str, bytes: &[u8])
where
    T: bincode::Encode + bincode::Decode<()> + PartialEq + std::fmt::Debug,
{
    let Ok(v) = decode::<T>(what, bytes) else {
        return;
    };
    let again = encode(what, &v).expect("a decoded record encodes");
    assert_eq!(
        decode::<T>(what, &again).expect("a re-encoded record decodes"),
        v
    );
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    match c % 6 {
        0 => round_trip::<ClaimRecord>("claim", bytes),
        1 => round_trip::<DoneRecord>("done", bytes),
        2 => round_trip::<RejectedRecord>("rejected", bytes),
        3 => round_trip::<AuditRecord>("audit", bytes),
        4 => round_trip::<KeyRecord>("key", bytes),
        _ => {
            let _ = decode_wal_parts(1, c / 6, bytes);
        }
    }
});
