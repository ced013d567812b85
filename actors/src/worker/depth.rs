//! How deep the worker's local queue runs. Pinned by `--prefetch`, or sized from the
//! worker's own pace: about as many tasks as it finishes in [`HORIZON`] at its measured
//! rate (or in two refills, when the planner takes longer to refill it: a distant
//! database), so short tasks get the deep queue that makes batches large and long ones a
//! shallow queue that leaves work for other workers. A burst arriving while the worker
//! idles does not wait for the rate to catch up: each refill that filled every free slot
//! after the handlers had run dry multiplies the depth by [`STARVED_GROWTH`] at once
//! ([`QueueDepth::starved`]).
//! Pure: the actor feeds it finishes, refill times and clock readings
//! ([`QueueDepth::finished`], [`QueueDepth::refilled`], [`QueueDepth::tick`]).

use std::time::{Duration, Instant};

/// The shallowest automatic queue: enough that a freed slot finds its next task here.
pub const MIN_DEPTH: usize = 4;
/// The deepest automatic queue: past this, batches grow no cheaper per task and a
/// worker that stops leaves too much to be handed back.
pub const MAX_DEPTH: usize = 2_000;
/// How much work the automatic queue holds: what the worker finishes in this long.
/// Longer than a planner round and a read (a few milliseconds), so slots never wait
/// for one; short enough that queued work is not kept from idle workers for long.
pub const HORIZON: Duration = Duration::from_millis(100);
/// How often the rate is sampled and the depth recomputed.
pub const TICK: Duration = Duration::from_millis(100);
/// The queue covers this many refills: what the worker finishes between giving slots
/// back (its outcomes written) and reading the tasks the planner put in them. The rate
/// measured can be no higher than the queue lets it be, one queue per refill; were the
/// refill longer than the horizon, a queue sized from that rate alone would stay small
/// for good. Covering two refills doubles it each tick until the handlers are the limit.
const REFILLS: f64 = 2.0;
/// How much a starved queue grows per refill: from the minimum to the maximum in four
/// refills (each a planner round and a read, a few milliseconds), where doubling took
/// nine and a burst of 20,000 short tasks ran a third of its time on a shallow queue.
pub const STARVED_GROWTH: usize = 8;
/// A longer wait for new tasks is a lull (nothing was runnable), not a refill.
pub const MAX_REFILL: Duration = Duration::from_millis(500);
/// Time constants of the rate's moving average. It rises fast, so a burst after an
/// idle spell deepens the queue within a few ticks (the rate measured is capped by the
/// depth, so each tick can only raise it so much); it falls slowly, so a pause of a
/// second does not empty the queue the next burst needs.
const RISE: Duration = Duration::from_millis(100);
const FALL: Duration = Duration::from_secs(1);

/// The depth for a completion rate (tasks per second) and refill time, within the bounds.
pub fn depth_for(rate: f64, refill: Duration) -> usize {
    let cover = HORIZON.as_secs_f64().max(REFILLS * refill.as_secs_f64());
    let d = (rate.max(0.0) * cover).round();
    (d.min(MAX_DEPTH as f64) as usize).clamp(MIN_DEPTH, MAX_DEPTH)
}

/// The local queue's depth: pinned, or following an exponentially weighted moving
/// average of the worker's completions per second.
#[derive(Debug, Clone)]
pub struct QueueDepth {
    pinned: Option<usize>,
    depth: usize,
    /// Tasks finished per second, averaged.
    rate: f64,
    /// Time from slots given back to their refill, seconds, averaged.
    refill: f64,
    /// Finished since `since`: the sample being gathered.
    finished: u64,
    since: Instant,
}

impl QueueDepth {
    /// `--prefetch N` pins the depth at N; `None` sizes it, starting at the minimum.
    pub fn new(pinned: Option<usize>, now: Instant) -> Self {
        QueueDepth {
            pinned,
            depth: pinned.unwrap_or(MIN_DEPTH),
            rate: 0.0,
            refill: 0.0,
            finished: 0,
            since: now,
        }
    }

    /// Tasks held beyond the handler slots, now.
    pub fn current(&self) -> usize {
        self.depth
    }

    /// Whether the depth follows the rate (no `--prefetch`).
    pub fn is_auto(&self) -> bool {
        self.pinned.is_none()
    }

    /// Tasks finished per second, as averaged at the last tick.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Counts `n` tasks finished.
    pub fn finished(&mut self, n: u64) {
        self.finished += n;
    }

    /// The time refills take, as averaged.
    pub fn refill(&self) -> Duration {
        Duration::from_secs_f64(self.refill)
    }

    /// A refill took `took`: from the write of outcomes (slots given back) to the read
    /// that brought new tasks. Waits longer than [`MAX_REFILL`] are lulls, not counted.
    pub fn refilled(&mut self, took: Duration) {
        if took <= MAX_REFILL {
            self.refill += 0.2 * (took.as_secs_f64() - self.refill);
        }
    }

    /// A refill filled every slot the worker had free, and its handlers had run out of
    /// work while they waited for it: the backlog is larger than the queue, and the
    /// queue, not the handlers, sets the pace. Multiplies the depth by [`STARVED_GROWTH`]
    /// now (a burst after idle reaches full depth in a few refills, not in the second or
    /// more the averaged rate takes),
    /// and raises the rate to match so the next ticks do not undo it; it decays as a
    /// measured rate does. Long handlers never get here: their queue never runs dry
    /// between refills. Returns the new depth, as [`QueueDepth::tick`] does.
    pub fn starved(&mut self) -> Option<usize> {
        if self.pinned.is_some() || self.depth >= MAX_DEPTH {
            return None;
        }
        self.depth = (self.depth * STARVED_GROWTH).clamp(MIN_DEPTH, MAX_DEPTH);
        let cover = HORIZON.as_secs_f64().max(REFILLS * self.refill);
        self.rate = self.rate.max(self.depth as f64 / cover);
        Some(self.depth)
    }

    /// Folds what finished since the last tick into the rate and recomputes the depth.
    /// Returns the new depth when it moved by a fifth or more, or onto a bound: worth
    /// telling the planners (each change is a write). Smaller moves are left out, so a
    /// steady worker writes nothing.
    pub fn tick(&mut self, now: Instant) -> Option<usize> {
        let dt = now.saturating_duration_since(self.since);
        if dt.is_zero() {
            return None;
        }
        let sample = self.finished as f64 / dt.as_secs_f64();
        self.finished = 0;
        self.since = now;
        let tau = if sample > self.rate { RISE } else { FALL };
        let alpha = 1.0 - (-dt.as_secs_f64() / tau.as_secs_f64()).exp();
        self.rate += alpha * (sample - self.rate);
        if self.pinned.is_some() {
            return None;
        }
        let target = depth_for(self.rate, self.refill());
        let moved = target.abs_diff(self.depth);
        let worth = moved * 5 >= self.depth || target == MIN_DEPTH || target == MAX_DEPTH;
        if moved == 0 || !worth {
            return None;
        }
        self.depth = target;
        Some(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `ticks` ticks finishing `per_tick` tasks in each; the depths announced.
    fn run(q: &mut QueueDepth, t: &mut Instant, ticks: usize, per_tick: u64) -> Vec<usize> {
        let mut announced = Vec::new();
        for _ in 0..ticks {
            q.finished(per_tick);
            *t += TICK;
            announced.extend(q.tick(*t));
        }
        announced
    }

    #[test]
    fn the_depth_is_what_finishes_in_the_horizon_within_bounds() {
        let quick = Duration::from_millis(5);
        assert_eq!(depth_for(0.0, quick), MIN_DEPTH);
        assert_eq!(depth_for(-5.0, quick), MIN_DEPTH);
        assert_eq!(depth_for(10.0, quick), MIN_DEPTH, "1 task per 100 ms");
        assert_eq!(depth_for(1_000.0, quick), 100);
        assert_eq!(depth_for(12_345.0, quick), 1_235);
        assert_eq!(depth_for(1e9, quick), MAX_DEPTH);
        assert_eq!(depth_for(f64::INFINITY, quick), MAX_DEPTH);
        // Refills of 200 ms: the queue covers two of them.
        assert_eq!(depth_for(1_000.0, Duration::from_millis(200)), 400);
    }

    #[test]
    fn short_tasks_deepen_the_queue_within_a_few_ticks() {
        let mut t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        assert_eq!(q.current(), MIN_DEPTH);
        // 10,000 tasks/s (1,000 per tick) asks for 1,000; three ticks in, the depth is
        // within the fifth that is not worth a write.
        let announced = run(&mut q, &mut t, 3, 1_000);
        assert!(q.current() >= 800, "after 300 ms: {announced:?}");
        assert!(announced.windows(2).all(|w| w[0] < w[1]), "{announced:?}");
        // Steady: nothing more to announce.
        assert_eq!(run(&mut q, &mut t, 20, 1_000), Vec::<usize>::new());
        // Faster still: the maximum.
        assert_eq!(run(&mut q, &mut t, 3, 5_000), vec![MAX_DEPTH]);
    }

    #[test]
    fn long_tasks_keep_it_shallow() {
        // Ten slots of one-second tasks: 10 tasks/s, one per tick.
        let mut t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        let announced = run(&mut q, &mut t, 50, 1);
        assert_eq!(q.current(), MIN_DEPTH, "{announced:?}");
        assert!((q.rate() - 10.0).abs() < 1.0, "rate {}", q.rate());
        // Handlers of 10 ms in 10 slots: 1,000 tasks/s, 100 ms of it is 100 tasks.
        run(&mut q, &mut t, 50, 100);
        assert!((80..=110).contains(&q.current()), "{}", q.current());
    }

    #[test]
    fn an_idle_worker_falls_back_to_the_minimum_slowly() {
        let mut t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        run(&mut q, &mut t, 10, 1_000);
        let busy = q.current();
        assert!(busy >= 800, "{busy}");
        // Half a second idle keeps most of it: a short pause between bursts.
        run(&mut q, &mut t, 5, 0);
        assert!(q.current() * 2 >= busy, "{} of {busy}", q.current());
        // Ten seconds idle: back to the minimum.
        let announced = run(&mut q, &mut t, 100, 0);
        assert_eq!(q.current(), MIN_DEPTH);
        assert_eq!(announced.last(), Some(&MIN_DEPTH));
        // Shrinking is announced in steps of a fifth or more, not every tick.
        assert!(announced.len() < 30, "{announced:?}");
    }

    #[test]
    fn a_pinned_depth_never_moves() {
        let mut t = Instant::now();
        let mut q = QueueDepth::new(Some(7), t);
        assert!(!q.is_auto());
        assert_eq!(run(&mut q, &mut t, 20, 5_000), Vec::<usize>::new());
        assert_eq!(q.current(), 7);
        assert!(
            q.rate() > 40_000.0,
            "the rate is still measured: {}",
            q.rate()
        );
        let mut q = QueueDepth::new(Some(0), t);
        assert_eq!(q.current(), 0, "--prefetch 0: no queue");
        assert_eq!(run(&mut q, &mut t, 5, 10), Vec::<usize>::new());
    }

    #[test]
    fn slow_refills_do_not_keep_the_queue_small() {
        // A distant database: a refill takes 150 ms, more than the horizon. Short tasks
        // run as fast as the queue refills: (10 slots + depth) per 150 ms.
        let refill = Duration::from_millis(150);
        let pace = |depth: usize| ((10 + depth) as f64 / 1.5) as u64; // per 100 ms tick
        let mut t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        for _ in 0..30 {
            q.finished(pace(q.current()));
            q.refilled(refill);
            t += TICK;
            q.tick(t);
        }
        assert_eq!(q.current(), MAX_DEPTH, "rate {}", q.rate());
        // The same from the rate alone would stay where it started.
        let mut q = QueueDepth::new(None, t);
        for _ in 0..30 {
            q.finished(pace(q.current()));
            t += TICK;
            q.tick(t);
        }
        assert!(q.current() < 20, "{}", q.current());
    }

    #[test]
    fn a_lull_is_not_a_refill() {
        let t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        q.refilled(Duration::from_secs(5));
        assert_eq!(q.refill(), Duration::ZERO);
        q.refilled(Duration::from_millis(10));
        assert!(q.refill() > Duration::ZERO && q.refill() < Duration::from_millis(10));
        // Long tasks stay shallow even with the slowest refills: what finishes in two.
        for _ in 0..50 {
            q.refilled(MAX_REFILL);
        }
        let mut t = t;
        for _ in 0..50 {
            q.finished(1); // 10 tasks/s
            t += TICK;
            q.tick(t);
        }
        assert!(q.current() <= 10, "{}", q.current());
    }

    #[test]
    fn a_starved_queue_grows_at_once_and_the_ticks_keep_it() {
        let mut t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        let grown: Vec<usize> = (0..4).filter_map(|_| q.starved()).collect();
        assert_eq!(grown, [32, 256, MAX_DEPTH]);
        assert_eq!(q.starved(), None, "at the maximum: nothing to announce");
        // The burst runs at the pace the depth allows: the ticks leave it where it is.
        assert_eq!(run(&mut q, &mut t, 10, 2_000), Vec::<usize>::new());
        // Idle again: it shrinks as after any busy spell, slowly.
        run(&mut q, &mut t, 5, 0);
        assert!(q.current() * 2 >= MAX_DEPTH, "{}", q.current());
        run(&mut q, &mut t, 100, 0);
        assert_eq!(q.current(), MIN_DEPTH);
        // A pinned depth never moves.
        let mut q = QueueDepth::new(Some(7), t);
        assert_eq!(q.starved(), None);
        assert_eq!(q.current(), 7);
    }

    #[test]
    fn a_tick_without_time_passing_changes_nothing() {
        let t = Instant::now();
        let mut q = QueueDepth::new(None, t);
        q.finished(1_000);
        assert_eq!(q.tick(t), None);
        assert_eq!(q.rate(), 0.0);
        // The finishes are kept for the next sample.
        assert!(q.tick(t + TICK).is_some());
    }
}
