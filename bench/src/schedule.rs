//! What runs when in the PLEG modes benchmark: how many rounds a pod count
//! gets (full rounds, then rounds that only time the batch start), and the
//! pace of container kills, which evlet's kill loop ([`crate::kills`]) and
//! the floor's ([`crate::floor`]) share, so neither kills on a node less
//! settled after its batch start, nor more often, than the other.

use std::ops::Range;
use std::time::Duration;

/// Batch start rounds at every pod count of a full run, unless asked
/// (`--start-rounds`): one 100-pod or larger start is a single sample of a
/// figure that varies by several percent from run to run.
pub const DEFAULT_START_ROUNDS: usize = 3;

/// The rounds at one pod count. Rounds `0..full` are full: the floor and
/// every mode with their batch start, kills and OOM kills (the first also
/// with the idle window and the CRI calls). Rounds `full..total` only start
/// the pods (the floor's and each mode's, with a fresh agent and fresh pods
/// as in a full round), so the start figures are the median of `total`
/// rounds at the cost of the starts alone. All go through `Run::merge` and
/// `Floor::merge`, as the full rounds always did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rounds {
    /// Rounds with kills and OOM kills; at least 1.
    pub full: usize,
    /// Every round, start-only ones included; at least `full`.
    pub total: usize,
}

impl Rounds {
    /// The rounds at `pods` pods. Full rounds (`--rounds`): by default
    /// 50 ÷ pods, from 1 to 5 (small counts, whose one run gives few
    /// samples). Start rounds (`--start-rounds`): by default
    /// [`DEFAULT_START_ROUNDS`] (a no-op where the full rounds are as many).
    /// `--quick` runs one full round whatever `--rounds` says, and one start
    /// round unless `--start-rounds` asks for more.
    pub fn of(
        pods: usize,
        quick: bool,
        rounds: Option<usize>,
        start_rounds: Option<usize>,
    ) -> Self {
        let full = if quick {
            1
        } else {
            rounds.unwrap_or((50 / pods.max(1)).clamp(1, 5)).max(1)
        };
        let starts = start_rounds.unwrap_or(if quick { 1 } else { DEFAULT_START_ROUNDS });
        Self {
            full,
            total: full.max(starts),
        }
    }

    /// Whether round `round` (from 0) kills, or only starts the pods.
    pub fn kills_in(self, round: usize) -> bool {
        round < self.full
    }
}

/// The gap after each kill's measurement, before the next kill, drawn
/// uniformly per kill (ms). A random phase against any periodic relist
/// (`generic`'s period is 1 s); the same range in evlet's kill loop
/// ([`crate::kills::kills`]) and the floor's ([`crate::floor::measure`]).
pub const KILL_GAP_MS: Range<u64> = 100..600;

/// One draw from [`KILL_GAP_MS`].
pub fn kill_gap() -> Duration {
    Duration::from_millis(fastrand::u64(KILL_GAP_MS))
}

/// How long after its batch start ends a round first kills, the same for
/// evlet and for the floor: `settle`, and in the round that measures the idle
/// window (the first) that window too, which evlet spends measuring its idle
/// CPU and the floor waiting. So the floor's kills, like evlet's, strike a
/// node that has had the same time to finish its start's work.
pub fn quiet_before_kills(round: usize, settle: Duration, idle: Duration) -> Duration {
    if round == 0 { settle + idle } else { settle }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_runs_start_three_times_at_every_large_count() {
        for pods in [100, 500, 1000] {
            let r = Rounds::of(pods, false, None, None);
            assert_eq!((r.full, r.total), (1, 3), "{pods} pods");
            assert!(r.kills_in(0));
            assert!(!r.kills_in(1) && !r.kills_in(2));
        }
        // Ten pods already run five full rounds: no start-only round.
        assert_eq!(
            Rounds::of(10, false, None, None),
            Rounds { full: 5, total: 5 }
        );
    }

    #[test]
    fn quick_runs_one_round_unless_start_rounds_are_asked_for() {
        assert_eq!(
            Rounds::of(10, true, Some(4), None),
            Rounds { full: 1, total: 1 }
        );
        assert_eq!(
            Rounds::of(10, true, None, Some(3)),
            Rounds { full: 1, total: 3 }
        );
    }

    #[test]
    fn asked_rounds_win_and_start_rounds_never_cut_full_ones() {
        assert_eq!(
            Rounds::of(500, false, None, Some(1)),
            Rounds { full: 1, total: 1 }
        );
        assert_eq!(
            Rounds::of(500, false, Some(4), Some(2)),
            Rounds { full: 4, total: 4 }
        );
        assert_eq!(
            Rounds::of(500, false, Some(0), Some(0)),
            Rounds { full: 1, total: 1 }
        );
    }

    #[test]
    fn kill_gaps_stay_in_their_range() {
        for _ in 0..10_000 {
            let ms = kill_gap().as_millis() as u64;
            assert!(KILL_GAP_MS.contains(&ms), "{ms} ms");
        }
    }

    #[test]
    fn the_first_round_waits_out_the_idle_window_before_killing() {
        let (settle, idle) = (Duration::from_secs(5), Duration::from_secs(120));
        assert_eq!(quiet_before_kills(0, settle, idle), settle + idle);
        assert_eq!(quiet_before_kills(1, settle, idle), settle);
    }
}
