//! "One call in flight, coalesce the repeats": the shape of every loop of an actor that
//! writes or reads the blackboard (the worker's outcomes, renewals, heartbeats, reads,
//! progress and retry policies; the Scanner's assignment rounds). A loop asked to run while its call is in flight either owes one more
//! run when the call ends ([`SingleFlight::start`]) or lets the request go
//! ([`SingleFlight::try_start`]: a timer's tick, which comes again anyway).

/// A loop's call in flight, and whether another run was asked for meanwhile.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SingleFlight {
    busy: bool,
    again: bool,
}

impl SingleFlight {
    /// Starts a call (true) unless one is in flight; then one more run is owed when it
    /// ends.
    pub fn start(&mut self) -> bool {
        if self.busy {
            self.again = true;
            return false;
        }
        self.busy = true;
        self.again = false;
        true
    }

    /// Starts a call (true) unless one is in flight; then nothing is owed.
    pub fn try_start(&mut self) -> bool {
        if self.busy {
            return false;
        }
        self.busy = true;
        true
    }

    /// Owes one more run after the call in flight, if there is one (true then).
    pub fn owe(&mut self) -> bool {
        self.again |= self.busy;
        self.busy
    }

    /// Owes one more run whether or not a call is in flight: the loop waits for another
    /// loop's call, whose end runs it ([`SingleFlight::take_owed`]).
    pub fn defer(&mut self) {
        self.again = true;
    }

    /// Whether a run is owed (deferred, or asked for in flight), forgetting it.
    pub fn take_owed(&mut self) -> bool {
        std::mem::take(&mut self.again)
    }

    /// The call in flight ended: whether another run was asked for meanwhile.
    pub fn end(&mut self) -> bool {
        self.busy = false;
        std::mem::take(&mut self.again)
    }

    /// Whether a call is in flight.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// Forgets the call in flight: an actor restarted, and it never reports back.
    pub fn reset(&mut self) {
        *self = SingleFlight::default();
    }
}

#[cfg(test)]
mod tests {
    use super::SingleFlight;

    #[test]
    fn repeats_asked_for_in_flight_coalesce_into_one_more_run() {
        let mut f = SingleFlight::default();
        assert!(f.start());
        assert!(!f.start());
        assert!(!f.start());
        assert!(f.busy());
        assert!(f.end(), "one more run is owed");
        assert!(!f.busy());
        assert!(f.start());
        assert!(!f.end(), "nothing was asked for meanwhile");
    }

    #[test]
    fn a_tick_in_flight_is_let_go_and_owe_only_counts_in_flight() {
        let mut f = SingleFlight::default();
        assert!(!f.owe(), "nothing in flight: nothing owed");
        assert!(f.try_start());
        assert!(!f.try_start());
        assert!(!f.end(), "a tick owes nothing");
        assert!(f.try_start());
        assert!(f.owe());
        f.reset();
        assert!(!f.busy());
        assert!(!f.end());
    }

    #[test]
    fn a_run_deferred_for_another_loop_is_owed_once() {
        let mut f = SingleFlight::default();
        f.defer();
        assert!(!f.busy());
        assert!(f.take_owed());
        assert!(!f.take_owed());
    }
}
