//! Every replication message kind, structured (`arbitrary`): encoded, then decoded from the
//! frame and read from a stream, each giving the same message back; one over the frame
//! limit is refused at `encode`. The mirror of `Message` is `roost_fuzz::repl::Any`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost_fuzz::repl::{message, Any};
use roost_replication::wire::{self, read_frame, LEN_PREFIX_BYTES};

fuzz_target!(init: roost_fuzz::limit_memory(), |a: Any| {
    let m = message(a);
    let f = wire::encode(&m, u32::MAX).expect("encoding under no limit");
    assert_eq!(wire::decode_frame(&f[LEN_PREFIX_BYTES..]).expect("an encoded frame decodes"), m);
    let mut r: &[u8] = &f;
    let read = roost_fuzz::ready(read_frame(&mut r, u32::MAX)).expect("an encoded frame reads");
    assert_eq!(read, Some(m.clone()));
    assert!(r.is_empty(), "bytes left after one frame");
    let small = (f.len() - LEN_PREFIX_BYTES - 1) as u32;
    assert!(wire::encode(&m, small).is_err(), "a frame over the limit was encoded");
});
