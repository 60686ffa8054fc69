//! An instance's part in presence: renewing this node's lease on its
//! members of the instance's subjects, re-sending leaves Redis did not
//! take, and putting back members a Redis lost (see `members.rs`).

use redis::Value;

use super::Instance;
use crate::engine::redis::members::{self, RENEW_BATCH};
use crate::engine::redis::ring;

impl Instance {
    /// Renews this node's lease on its members of every subject of this
    /// instance: one script call per [`RENEW_BATCH`] subjects, however many
    /// members they hold; the subjects where Redis lost some of them get
    /// them back with one more call per batch. A failure is left to the
    /// next renewal (a third of a lease later).
    pub(super) async fn renew(&mut self) {
        let Some(mut conn) = self.conn.clone() else {
            return;
        };
        let (index, instances) = (self.index, self.ctx.instances);
        let ours = |s: &str| ring::instance_of(s, instances) == index;
        let members = &self.ctx.members;
        let base = &self.ctx.bases[index];
        let mut lost = members.take_lost(ours).into_iter();
        while let Some((subject, member)) = lost.next() {
            let mut call = members::call(&self.ctx.scripts.presence, base, "leave");
            call.arg(&*subject).arg(&members.node).arg(&*member);
            if let Err(e) = call.query_async::<Value>(&mut conn).await {
                tracing::warn!(error = %e, "a lost presence leave failed again");
                members.lost_leave(subject, member);
                lost.for_each(|(s, m)| members.lost_leave(s, m));
                return;
            }
        }
        let subjects = members.subjects(ours);
        let lease = self.ctx.settings.presence_lease.as_millis() as u64;
        for batch in subjects.chunks(RENEW_BATCH) {
            let mut call = members::call(&self.ctx.scripts.presence, base, "renew");
            call.arg(&members.node).arg(lease);
            for (subject, taken) in batch {
                call.arg(&**subject).arg(*taken);
            }
            let short = match call.query_async::<Vec<u64>>(&mut conn).await {
                Ok(reply) => {
                    members.expired_on(index, reply.first().copied().unwrap_or(0));
                    reply.into_iter().skip(1)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a presence lease renewal failed");
                    return;
                }
            };
            // Nothing of this instance is sent while this task renews, so
            // a leave released since the count is made after the restore.
            let mut call = members::call(&self.ctx.scripts.presence, base, "restore");
            call.arg(&members.node).arg(lease);
            let mut restoring = 0;
            for place in short {
                let at = (place as usize).checked_sub(1);
                let Some((subject, _)) = at.and_then(|at| batch.get(at)) else {
                    continue;
                };
                let taken = members.taken_in(subject);
                call.arg(&**subject).arg(taken.len());
                for (id, held) in taken {
                    call.arg(&*id)
                        .arg(held.user.as_deref().unwrap_or(""))
                        .arg(held.info.as_deref().unwrap_or(""));
                }
                restoring += 1;
            }
            if restoring == 0 {
                continue;
            }
            match call.query_async::<Vec<u64>>(&mut conn).await {
                Ok(put) => tracing::info!(
                    subjects = restoring,
                    members = put.first().copied().unwrap_or(0),
                    "put back presence members Redis had lost"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "restoring lost presence members failed");
                    return;
                }
            }
        }
    }
}
