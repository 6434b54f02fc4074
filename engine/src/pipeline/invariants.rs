//! Invariants asserted where they must hold (issue 46, as TigerBeetle asserts its own): a
//! broken one stops the process at once (the panic hook exits 70) instead of surfacing far
//! away as a repeated id or an answer a power loss can take back. No input, disk content or
//! peer can break them, only a bug: every error a client, a disk or a peer can cause is an
//! error value, never one of these.

use roost_wal::Lsn;

/// A claim at `lsn` whose ids start at `first_id`, made after the claim `last` (its lsn and
/// the id after its ids): claims are made in lsn order and their ids increase with their
/// lsns, so no id is minted twice.
pub(super) fn claim_follows(last: (Lsn, u64), lsn: Lsn, first_id: u64) {
    assert!(
        lsn > last.0 && first_id >= last.1,
        "invariant broken: the claim at lsn {lsn} mints ids from {first_id}, after the claim at lsn {} whose ids end before {}",
        last.0,
        last.1
    );
}

/// An answer for the claim at `lsn` is given only once the claim is durable (`synced`: the
/// WAL's highest lsn known durable).
pub(super) fn answer_is_durable(lsn: Lsn, synced: Lsn) {
    assert!(
        lsn <= synced,
        "invariant broken: an answer for the claim at lsn {lsn}, but the WAL is durable only through lsn {synced}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_in_order_with_increasing_ids_pass() {
        claim_follows((0, 0), 1, 1);
        claim_follows((1, 11), 2, 11);
        claim_follows((2, 11), 5, 11); // a rejection or a delete-only claim between
        answer_is_durable(7, 7);
        answer_is_durable(3, 7);
    }

    #[test]
    #[should_panic(expected = "the claim at lsn 5 mints ids from 10")]
    fn ids_going_back_stop_the_process() {
        claim_follows((4, 11), 5, 10);
    }

    #[test]
    #[should_panic(expected = "the claim at lsn 4 mints ids")]
    fn a_claim_not_after_the_last_stops_the_process() {
        claim_follows((4, 11), 4, 11);
    }

    #[test]
    #[should_panic(expected = "durable only through lsn 7")]
    fn an_answer_before_durability_stops_the_process() {
        answer_is_durable(8, 7);
    }
}
