//! `CHECKPOINT` (`records::decode_checkpoint`): any bytes give a checkpoint or an error;
//! one that decodes re-encodes to bytes that decode equal. The first input byte says
//! whether to fix the header's length and CRC first, so the bincode payload is reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost::pipeline::records::{decode_checkpoint, encode_checkpoint};

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    let mut b = bytes.to_vec();
    if c & 1 == 1 && b.len() >= 9 {
        let len = (b.len() - 9) as u32;
        b[5..9].copy_from_slice(&len.to_le_bytes());
        let end = b.len();
        roost_fuzz::fix_crc(&mut b, 1, 9, end);
    }
    let Ok(cp) = decode_checkpoint(&b) else {
        return;
    };
    let again = encode_checkpoint(&cp).expect("a decoded checkpoint encodes");
    assert_eq!(decode_checkpoint(&again).as_ref(), Ok(&cp));
});
