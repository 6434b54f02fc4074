//! `KafkaTruncateToHighWatermark.tla`: before KIP-101, a replica that becomes a follower
//! truncates its log to its own high watermark.

use crate::base;
use crate::step::{Label, Successors};
use crate::types::{Config, State};

/// `BecomeFollowerTruncateToHighWatermark`.
pub fn become_follower_truncate_to_high_watermark(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        for replica in cfg.all() {
            let replica_hw = s.rs(replica).hw;
            let label = Label::new("BecomeFollowerTruncateToHighWatermark")
                .replica("leader", leader)
                .replica("replica", replica);
            base::become_follower_and_truncate_to(s, Some(leader), replica, replica_hw, label, out);
        }
    }
}

/// `Next`.
pub fn next(cfg: &Config, s: &State, out: &mut Successors) {
    base::controller_elect_leader(cfg, s, out);
    base::controller_shrink_isr(cfg, s, out);
    base::become_leader(cfg, s, out);
    base::leader_expand_isr(cfg, s, out);
    base::leader_shrink_isr(cfg, s, out);
    base::leader_write(cfg, s, out);
    base::leader_inc_high_watermark(cfg, s, out);
    become_follower_truncate_to_high_watermark(cfg, s, out);
    base::follower_replicate(cfg, s, out);
}
