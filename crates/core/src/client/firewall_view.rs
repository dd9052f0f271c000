//! The view a client behind a privacy firewall follows (second review, G7).

use crate::types::{ReplicaId, View};

/// What a client behind a firewall keeps: per replica the highest view it reported with a
/// certified reply. The view a reply
/// reports lies outside the execution cluster's signature, so one replica's report is no
/// evidence (second review, G7: a faulty replica naming a view it leads had every later
/// request of the client go to it first, at a retransmission timeout each); the view the
/// client follows is the (f+1)-th highest report, vouched for by a correct replica.
pub(super) struct FirewallView {
    pub(super) views: Vec<View>,
}

impl FirewallView {
    /// Replica `r` passed on a certified reply in `view`; returns the view f+1 replicas
    /// reported, at least.
    pub(super) fn report(&mut self, f: u32, r: ReplicaId, view: View) -> View {
        vouched_view(&mut self.views, f, r, view)
    }
}

/// Records that replica `r` reported `view` in `views` (the highest view each replica
/// reported) and returns the (f+1)-th highest: a view at least one correct replica reached.
fn vouched_view(views: &mut [View], f: u32, r: ReplicaId, view: View) -> View {
    if let Some(v) = views.get_mut(r as usize) {
        *v = (*v).max(view);
    }
    let mut sorted = views.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.get(f as usize).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Second review, G7: behind the firewall one faulty replica's view hint no longer moves
    /// the client; f+1 replicas' do.
    #[test]
    fn a_firewall_client_follows_the_view_f_plus_1_replicas_report() {
        let mut views = vec![0; 4];
        // Replica 3 claims view 7, which it leads.
        assert_eq!(vouched_view(&mut views, 1, 3, 7), 0);
        assert_eq!(vouched_view(&mut views, 1, 3, 11), 0);
        // A correct replica reports view 1: f+1 replicas are at view 1 or beyond.
        assert_eq!(vouched_view(&mut views, 1, 0, 1), 1);
        // Reports never go down, and an out-of-range sender counts for nothing.
        assert_eq!(vouched_view(&mut views, 1, 0, 0), 1);
        assert_eq!(vouched_view(&mut views, 1, 9, 50), 1);
        // f = 2: two liars are not enough.
        let mut views = vec![0; 7];
        vouched_view(&mut views, 2, 5, 12);
        assert_eq!(vouched_view(&mut views, 2, 6, 13), 0);
        assert_eq!(vouched_view(&mut views, 2, 1, 2), 2);
    }
}
