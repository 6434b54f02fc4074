//! `Kip279.tla`: a new follower truncates to one past the last offset where its log and the
//! leader's hold the same record.

use crate::base;
use crate::step::{Label, Successors};
use crate::types::{Config, Replica, State};

/// `MatchingOffsets(replica1, replica2)`.
pub fn matching_offsets(
    s: &State,
    replica1: Replica,
    replica2: Replica,
) -> impl Iterator<Item = u8> + '_ {
    let other = s.log(replica2);
    s.log(replica1)
        .all_entries()
        .filter(move |&(offset, record)| other.has_entry(record, offset))
        .map(|(offset, _)| offset)
}

/// `FirstNonMatchingOffsetFromTail(leader, follower)`.
pub fn first_non_matching_offset_from_tail(s: &State, leader: Replica, follower: Replica) -> u8 {
    if s.log(leader).is_empty() {
        return 0;
    }
    matching_offsets(s, follower, leader)
        .max()
        .map_or(0, |max| max + 1)
}

/// `BecomeFollowerTruncateKip279`. The first disjunct (an empty replica truncates to 0) gives
/// states the second also gives; both are generated, as TLC would.
pub fn become_follower_truncate_kip279(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        for replica in cfg.all() {
            let label = Label::new("BecomeFollowerTruncateKip279")
                .replica("leader", leader)
                .replica("replica", replica);
            if s.log(replica).is_empty() {
                base::become_follower_and_truncate_to(s, Some(leader), replica, 0, label, out);
            }
            let offset = first_non_matching_offset_from_tail(s, leader, replica);
            base::become_follower_and_truncate_to(s, Some(leader), replica, offset, label, out);
        }
    }
}

/// `Next` (declared `LOCAL` in the module).
pub fn next(cfg: &Config, s: &State, out: &mut Successors) {
    base::controller_elect_leader(cfg, s, out);
    base::controller_shrink_isr(cfg, s, out);
    base::become_leader(cfg, s, out);
    base::leader_expand_isr(cfg, s, out);
    base::leader_shrink_isr(cfg, s, out);
    base::leader_write(cfg, s, out);
    base::leader_inc_high_watermark(cfg, s, out);
    become_follower_truncate_kip279(cfg, s, out);
    base::follower_replicate(cfg, s, out);
}
