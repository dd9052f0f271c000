//! The host loop every node process runs (replica, execution node, filter node): one task
//! owns the node, and each turn it wakes for a stop signal, a state check (SIGUSR1, where the
//! node asks for it), a tick, or a frame from the listener or a link, hands it to the node,
//! lets the node finish the turn (metrics, flush), and refreshes the node's metrics and
//! status every [`STATUS_REFRESH`].
//!
//! What differs between the kinds of node is [`Hosted`]: what a tick and a frame do, whether
//! more waiting frames join the turn, how the node stops.

use crate::endpoints::Charged;
use crate::runtime::NodeError;
use redoubt_config::ClusterConfig;
use redoubt_core::HolderAnswer;
use redoubt_transport::ConnId;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

/// How often metrics and the JSON status are refreshed.
pub(crate) const STATUS_REFRESH: Duration = Duration::from_millis(100);

/// Wall-clock time (Unix ms), for the core's `Env`.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The tick of a replica and of an execution node (`[node] tick_ms`).
pub(crate) fn tick_period(cfg: &ClusterConfig) -> Duration {
    Duration::from_millis(cfg.node.tick_ms.max(1))
}

/// What a node does when SIGTERM or SIGINT asks it to stop.
pub(crate) enum Stop {
    /// Stop at once.
    Now,
    /// Keep running until [`Hosted::handed_over`] holds or this much time has passed; a
    /// second signal stops at once.
    HandOver(Duration),
}

/// How many frames wait in the inbound queues at the end of a turn.
pub(crate) struct Depths {
    pub listener: usize,
    pub links: usize,
}

/// A node as the host loop sees it.
pub(crate) trait Hosted {
    /// A frame as the endpoints' tasks queue it (opened there or as received).
    type Frame;
    /// Frames already waiting that a turn woken by a frame handles too, links' and
    /// listener's in turn, before it ends (group commit); none by default.
    const BATCH_MORE: usize = 0;
    /// Whether the first refresh follows the first turn; by default it comes
    /// [`STATUS_REFRESH`] after the loop starts.
    const REFRESH_AT_ONCE: bool = false;

    /// The tick: time has passed.
    fn tick(&mut self);
    /// A frame read on the listener's connection `conn`.
    fn listener_frame(&mut self, conn: ConnId, frame: Self::Frame);
    /// A frame read on a link (an answer on a link this node opened).
    fn link_frame(&mut self, frame: Self::Frame);
    /// Refreshes metrics and the JSON status (every [`STATUS_REFRESH`] at most).
    fn refresh(&mut self);
    /// Asked to stop by a signal.
    fn stop(&mut self) -> Stop {
        Stop::Now
    }
    /// While handing over ([`Stop::HandOver`]): whether the node may stop now.
    fn handed_over(&self) -> bool {
        true
    }
    /// The key holder answered a call of the node's (see `crate::holder::HolderDesk`).
    fn holder_answer(&mut self, _answer: HolderAnswer) {}
    /// SIGUSR1, for nodes whose [`Signals`] take it: check the state now.
    fn check_state(&mut self) {}
    /// SIGUSR2, for nodes whose [`Signals`] take it: write a snapshot of the stable
    /// checkpoint.
    fn snapshot(&mut self) {}
    /// Every frame that waited has been handled (after a turn of frames, or a key holder's
    /// answer, which may release held ones): work that serves the whole turn goes now. A
    /// tick does such work itself.
    fn idle(&mut self) {}
    /// The turn's work is done, after `took`, and `depths` frames wait.
    fn turn_done(&mut self, _took: Duration, _depths: Depths) {}
    /// Ends a turn (and the loop): makes durable what must be, then sends.
    fn flush(&mut self) {}
    /// The loop has ended (after a last [`flush`](Hosted::flush)).
    fn stopped(&mut self);
}

/// The signals a node stops on (SIGTERM, SIGINT) and, for nodes that hold state, SIGUSR1 (a
/// state check) and SIGUSR2 (a snapshot).
pub(crate) struct Signals {
    term: Signal,
    int: Signal,
    check_state: Option<Signal>,
    snapshot: Option<Signal>,
}

impl Signals {
    /// Takes SIGTERM and SIGINT, SIGUSR1 if `check_state` and SIGUSR2 if `snapshot`
    /// (otherwise they keep their default action).
    pub(crate) fn new(check_state: bool, snapshot: bool) -> Result<Signals, NodeError> {
        let take = |kind| signal(kind).map_err(NodeError::Signal);
        Ok(Signals {
            term: take(SignalKind::terminate())?,
            int: take(SignalKind::interrupt())?,
            check_state: check_state
                .then(|| take(SignalKind::user_defined1()))
                .transpose()?,
            snapshot: snapshot
                .then(|| take(SignalKind::user_defined2()))
                .transpose()?,
        })
    }
}

/// A node's inbound queues: the listener's frames with their connections, the links', and
/// its key holder's answers (nodes with session keys).
pub(crate) struct Inbound<F> {
    pub listener: mpsc::Receiver<(ConnId, Charged<F>)>,
    pub links: mpsc::Receiver<Charged<F>>,
    pub holder: Option<mpsc::Receiver<HolderAnswer>>,
}

impl<F> Inbound<F> {
    /// Hands `host` up to [`Hosted::BATCH_MORE`] frames that already wait.
    fn drain<H: Hosted<Frame = F>>(&mut self, host: &mut H) {
        let mut handled = 0;
        while handled < H::BATCH_MORE {
            let mut any = false;
            if let Ok(frame) = self.links.try_recv() {
                host.link_frame(frame.take());
                handled += 1;
                any = true;
            }
            if let Ok((conn, frame)) = self.listener.try_recv() {
                host.listener_frame(conn, frame.take());
                handled += 1;
                any = true;
            }
            if !any {
                break;
            }
        }
    }
}

/// The next answer of the key holder, or never without one.
async fn next_answer(holder: &mut Option<mpsc::Receiver<HolderAnswer>>) -> Option<HolderAnswer> {
    match holder {
        Some(h) => h.recv().await,
        None => std::future::pending().await,
    }
}

/// The next delivery of `signal`, or never without one.
async fn next(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Runs `host` until a stop signal (and its hand-over, if it asks for one), ticking every
/// `tick_every` (ticks missed while busy are skipped).
pub(crate) async fn serve<H: Hosted>(
    mut host: H,
    mut signals: Signals,
    mut inbound: Inbound<H::Frame>,
    tick_every: Duration,
) {
    // The executable's hash, which every status refresh reports, is read once, before the
    // first frame (it reads the whole file).
    let _ = crate::status::own_executable_blake3();
    let mut tick = tokio::time::interval(tick_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    enum Wake<F> {
        Stop,
        CheckState,
        Snapshot,
        Tick,
        Listener(ConnId, Charged<F>),
        Link(Charged<F>),
        Holder(HolderAnswer),
    }
    let mut stop_deadline: Option<Instant> = None;
    let mut last_refresh = (!H::REFRESH_AT_ONCE).then(Instant::now);
    loop {
        if let Some(d) = stop_deadline {
            if host.handed_over() || Instant::now() >= d {
                break;
            }
        }
        let wake = tokio::select! {
            _ = signals.term.recv() => Wake::Stop,
            _ = signals.int.recv() => Wake::Stop,
            _ = next(&mut signals.check_state) => Wake::CheckState,
            _ = next(&mut signals.snapshot) => Wake::Snapshot,
            _ = tick.tick() => Wake::Tick,
            Some((conn, frame)) = inbound.listener.recv() => Wake::Listener(conn, frame),
            Some(frame) = inbound.links.recv() => Wake::Link(frame),
            Some(answer) = next_answer(&mut inbound.holder) => Wake::Holder(answer),
        };
        let t = Instant::now();
        match wake {
            Wake::Stop => {
                if stop_deadline.is_some() {
                    break;
                }
                match host.stop() {
                    Stop::Now => break,
                    Stop::HandOver(within) => stop_deadline = Some(Instant::now() + within),
                }
            }
            Wake::CheckState => host.check_state(),
            Wake::Snapshot => host.snapshot(),
            Wake::Tick => host.tick(),
            Wake::Listener(conn, frame) => {
                host.listener_frame(conn, frame.take());
                inbound.drain(&mut host);
                host.idle();
            }
            Wake::Link(frame) => {
                host.link_frame(frame.take());
                inbound.drain(&mut host);
                host.idle();
            }
            Wake::Holder(answer) => {
                host.holder_answer(answer);
                host.idle();
            }
        }
        let took = t.elapsed();
        let depths = Depths {
            listener: inbound.listener.len(),
            links: inbound.links.len(),
        };
        host.turn_done(took, depths);
        host.flush();
        // Metrics, status and peer checks take locks: refresh them a few times a second, not
        // on every turn of the loop.
        if last_refresh.is_none_or(|t| t.elapsed() >= STATUS_REFRESH) {
            host.refresh();
            last_refresh = Some(Instant::now());
        }
    }
    host.flush();
    host.stopped();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::{as_received, Opening};
    use prometheus::IntCounter;
    use redoubt_transport::{ByteBudget, ConnInbound, Inbound as LinkInbound};
    use std::sync::{Arc, Mutex};

    /// What the host loop asked of a node, in order.
    #[derive(Default)]
    struct Log {
        seen: Vec<String>,
        ticks_after_stop: Option<u32>,
    }

    struct Recorder(Arc<Mutex<Log>>);

    impl Recorder {
        fn note(&self, what: String) {
            self.0.lock().unwrap().seen.push(what);
        }
    }

    impl Hosted for Recorder {
        type Frame = Vec<u8>;
        const BATCH_MORE: usize = 3;

        fn tick(&mut self) {
            if let Some(n) = &mut self.0.lock().unwrap().ticks_after_stop {
                *n += 1;
            }
        }
        fn listener_frame(&mut self, conn: ConnId, frame: Vec<u8>) {
            self.note(format!("listener {} {}", conn.0, frame[0]));
        }
        fn link_frame(&mut self, frame: Vec<u8>) {
            self.note(format!("link {}", frame[0]));
        }
        fn refresh(&mut self) {}
        fn idle(&mut self) {
            self.note("idle".into());
        }
        fn stop(&mut self) -> Stop {
            self.note("stop".into());
            self.0.lock().unwrap().ticks_after_stop = Some(0);
            Stop::HandOver(Duration::from_secs(5))
        }
        fn handed_over(&self) -> bool {
            self.0.lock().unwrap().ticks_after_stop >= Some(3)
        }
        fn flush(&mut self) {
            let mut log = self.0.lock().unwrap();
            if log.seen.last().is_none_or(|s| s != "flush") {
                log.seen.push("flush".into());
            }
        }
        fn stopped(&mut self) {
            self.note("stopped".into());
        }
    }

    /// Inbound queues, and what delivers frames to them.
    fn queues() -> (Inbound<Vec<u8>>, impl ConnInbound, impl LinkInbound) {
        let budget = || ByteBudget::new(1 << 20);
        let dropped = || IntCounter::new("dropped", "frames dropped").unwrap();
        let (listener_tx, listener) = mpsc::channel(16);
        let (links_tx, links) = mpsc::channel(16);
        (
            Inbound {
                listener,
                links,
                holder: None,
            },
            Opening::new(listener_tx, as_received(), budget(), dropped()),
            Opening::new(links_tx, as_received(), budget(), dropped()),
        )
    }

    #[test]
    fn a_turn_takes_what_waits_links_and_listener_in_turn_up_to_the_batch() {
        let (mut inbound, listener, links) = queues();
        for i in 1..=2 {
            assert!(links.deliver(vec![i]));
        }
        for i in 3..=5 {
            assert!(listener.deliver(ConnId(7), vec![i]));
        }
        let log = Arc::new(Mutex::new(Log::default()));
        inbound.drain(&mut Recorder(log.clone()));
        // Two rounds of two: the batch (3) is checked before each round.
        assert_eq!(
            log.lock().unwrap().seen,
            ["link 1", "listener 7 3", "link 2", "listener 7 4"]
        );
        assert_eq!(inbound.listener.len(), 1);
    }

    #[tokio::test]
    async fn a_node_that_hands_over_runs_on_until_it_has_then_flushes_and_stops() {
        let (inbound, listener, _links) = queues();
        let log = Arc::new(Mutex::new(Log::default()));
        let signals = Signals::new(false, false).unwrap();
        let host = tokio::spawn(serve(
            Recorder(log.clone()),
            signals,
            inbound,
            Duration::from_millis(5),
        ));
        assert!(listener.deliver(ConnId(1), vec![9]));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        tokio::time::timeout(Duration::from_secs(3), host)
            .await
            .expect("the loop ends once handed over, well before its deadline")
            .unwrap();
        let log = log.lock().unwrap();
        assert_eq!(
            log.seen,
            ["listener 1 9", "idle", "flush", "stop", "flush", "stopped"]
        );
        assert_eq!(log.ticks_after_stop, Some(3));
    }
}
