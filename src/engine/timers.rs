//! Transport timers: the local ACK timeout, the RNR wait, and the queue of QP deadlines.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use super::time::Instant;

/// Local ACK timeout for the `timeout` attribute: 4.096 us x 2^timeout (IBTA 9.7.6.1.3,
/// C9-140); 0 means "infinite" (no timer).
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let ns = 4096u64 << timeout.min(31);
    Some(Duration::from_nanos(ns))
}

/// The RNR wait for a timer code (IBTA 9.7.5.2.8, table 45; only the low 5 bits count).
/// The table lives with the AETH that carries the code: [`crate::wire::rnr_timer`].
pub fn rnr_delay(code: u8) -> Duration {
    crate::wire::rnr_timer(code)
}

type QpnMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<super::QpnHasher>>;

/// The QPs' timer deadlines, earliest first: `poll_timeout` is a look at the top and
/// `handle_timeout` takes only the QPs whose deadline has come, whatever the number of QPs.
///
/// A QP has at most one deadline in force, the earlier of its local ACK timer and its RNR
/// wait. Re-arming pushes a new entry and leaves the old one in the heap, where it is stale:
/// an entry is in force only while its sequence number is the one recorded for its QP (lazy
/// invalidation). Stale entries are popped as soon as they reach the top, so the top is
/// always in force, and the heap is rebuilt when stale entries outnumber live ones.
#[derive(Default)]
pub(crate) struct TimerQueue {
    /// (deadline, sequence number, QPN); the sequence number also orders equal deadlines
    /// by arming order.
    heap: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    /// The entry in force per QP: (deadline, sequence number).
    armed: QpnMap<(Instant, u64)>,
    next_seq: u64,
}

impl TimerQueue {
    /// Arm, re-arm or (with `None`) disarm the timer of `qpn`. Setting the deadline already
    /// in force changes nothing.
    pub fn set(&mut self, qpn: u32, deadline: Option<Instant>) {
        match deadline {
            None => {
                if self.armed.remove(&qpn).is_some() {
                    self.prune();
                }
            }
            Some(at) => {
                if self.armed.get(&qpn).is_some_and(|&(d, _)| d == at) {
                    return;
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                self.armed.insert(qpn, (at, seq));
                self.heap.push(Reverse((at, seq, qpn)));
                self.prune();
            }
        }
    }

    /// The deadline in force for `qpn`.
    #[cfg(test)]
    pub fn deadline(&self, qpn: u32) -> Option<Instant> {
        self.armed.get(&qpn).map(|&(d, _)| d)
    }

    /// The earliest deadline in force.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((d, _, _))| *d)
    }

    /// Take the QP with the earliest deadline if that deadline is at or before `now`; its
    /// timer is disarmed (set it again after running it).
    pub fn pop_expired(&mut self, now: Instant) -> Option<u32> {
        let &Reverse((at, _, qpn)) = self.heap.peek()?;
        if at > now {
            return None;
        }
        self.heap.pop();
        self.armed.remove(&qpn);
        self.prune();
        Some(qpn)
    }

    /// Number of QPs with a deadline in force.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.armed.len()
    }

    fn in_force(&self, entry: &(Instant, u64, u32)) -> bool {
        let (at, seq, qpn) = *entry;
        self.armed.get(&qpn) == Some(&(at, seq))
    }

    /// Restore the invariants: the top is in force, and stale entries are at most about
    /// as many as live ones (so the heap stays O(QPs) however often timers are re-armed).
    fn prune(&mut self) {
        if self.heap.len() > 2 * self.armed.len() + 32 {
            // Rebuilt in the heap's own storage: no allocation on this path.
            let mut entries = std::mem::take(&mut self.heap).into_vec();
            entries.clear();
            entries.extend(
                self.armed
                    .iter()
                    .map(|(&qpn, &(at, seq))| Reverse((at, seq, qpn))),
            );
            self.heap = BinaryHeap::from(entries);
            return;
        }
        while let Some(Reverse(top)) = self.heap.peek() {
            if self.in_force(top) {
                break;
            }
            self.heap.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn local_ack_timeout_values() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        // 14: 4.096 us x 2^14 = 67.1 ms, rxe's default.
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(67_108_864))
        );
    }

    #[test]
    fn rnr_delay_is_the_aeth_table() {
        assert_eq!(rnr_delay(0), Duration::from_micros(655_360));
        assert_eq!(rnr_delay(1), Duration::from_micros(10));
        assert_eq!(rnr_delay(12), Duration::from_micros(640));
        assert_eq!(rnr_delay(31), Duration::from_micros(491_520));
        // Only the low 5 bits count.
        assert_eq!(rnr_delay(32 + 12), rnr_delay(12));
    }

    #[test]
    fn rearm_and_disarm() {
        let t = |ns| Instant::from_nanos(ns);
        let mut q = TimerQueue::default();
        q.set(7, Some(t(100)));
        q.set(8, Some(t(50)));
        assert_eq!(q.next_deadline(), Some(t(50)));
        q.set(8, Some(t(200)));
        assert_eq!(q.next_deadline(), Some(t(100)));
        q.set(7, None);
        assert_eq!(q.next_deadline(), Some(t(200)));
        assert_eq!(q.pop_expired(t(199)), None);
        assert_eq!(q.pop_expired(t(200)), Some(8));
        assert_eq!(q.next_deadline(), None);
        assert_eq!(q.len(), 0);
        assert!(q.heap.is_empty());
    }

    #[test]
    fn stale_entries_do_not_pile_up() {
        let mut q = TimerQueue::default();
        for qpn in 0..100 {
            q.set(qpn, Some(Instant::from_nanos(1_000_000)));
        }
        // Re-armed on every ACK, later each time, far more often than the timers fire.
        for round in 0..1_000u64 {
            for qpn in 0..100 {
                q.set(
                    qpn,
                    Some(Instant::from_nanos(1_000_000 + round * 100 + qpn as u64)),
                );
            }
        }
        assert_eq!(q.len(), 100);
        assert!(q.heap.len() <= 2 * 100 + 33, "{} entries", q.heap.len());
        assert_eq!(
            q.next_deadline(),
            Some(Instant::from_nanos(1_000_000 + 999 * 100))
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Set(u32, Option<u64>),
        Fire(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..16, proptest::option::of(0u64..1_000)).prop_map(|(q, d)| Op::Set(q, d)),
            (0u64..1_000).prop_map(Op::Fire),
        ]
    }

    proptest! {
        /// The queue agrees with a brute-force scan of every QP's deadline after any sequence
        /// of arming, re-arming, disarming and firing.
        #[test]
        fn agrees_with_a_scan(ops in proptest::collection::vec(op(), 0..200)) {
            let mut q = TimerQueue::default();
            let mut model: std::collections::BTreeMap<u32, Instant> = Default::default();
            for op in ops {
                match op {
                    Op::Set(qpn, d) => {
                        let d = d.map(Instant::from_nanos);
                        q.set(qpn, d);
                        match d {
                            Some(d) => model.insert(qpn, d),
                            None => model.remove(&qpn),
                        };
                    }
                    Op::Fire(now) => {
                        let now = Instant::from_nanos(now);
                        let mut fired = Vec::new();
                        while let Some(qpn) = q.pop_expired(now) {
                            fired.push(qpn);
                        }
                        let mut due: Vec<u32> =
                            model.iter().filter(|(_, &d)| d <= now).map(|(&q, _)| q).collect();
                        model.retain(|_, d| *d > now);
                        // Fired earliest deadline first.
                        let mut sorted = fired.clone();
                        sorted.sort_unstable();
                        due.sort_unstable();
                        prop_assert_eq!(sorted, due);
                    }
                }
                prop_assert_eq!(q.next_deadline(), model.values().min().copied());
                prop_assert_eq!(q.len(), model.len());
                for (&qpn, &d) in &model {
                    prop_assert_eq!(q.deadline(qpn), Some(d));
                }
            }
        }
    }
}
