//! `RaftBackup`: a consistent checkpoint of the metadata (the replicated state machine's, or a
//! lone metaserver's store in the same format), streamed in chunks while the server serves.

use cairn_common::CairnError;
use tonic::Status;

use super::MetaService;

/// Bytes of a metadata backup per streamed chunk.
const BACKUP_CHUNK: usize = 1 << 20;

/// What `RaftBackup` answers with.
pub(super) type BackupStream =
    tokio_stream::wrappers::ReceiverStream<Result<cairn_proto::BackupChunk, Status>>;

impl MetaService {
    /// The backup, as a stream of chunks: the first names the applied index and total bytes.
    pub(super) async fn backup_stream(&self) -> Result<BackupStream, Status> {
        let (applied_index, file, total_bytes) = if self.replicated {
            let raft = self.raft()?.clone();
            tokio::task::spawn_blocking(move || raft.backup())
                .await
                .map_err(|e| CairnError::internal(e.to_string()))??
        } else {
            // A lone metaserver: a checkpoint of its store, in the same format.
            let ns = self.ns()?;
            let (file, size) =
                tokio::task::spawn_blocking(move || crate::raft::state::pack_lone(&**ns.store()))
                    .await
                    .map_err(|e| CairnError::internal(e.to_string()))??;
            (0, file, size)
        };
        let (send, receive) = tokio::sync::mpsc::channel(2);
        // Chunks are read on the blocking pool and sent as the receiver takes them; a receiver
        // that goes away ends the reading (the file, already unlinked, goes with it).
        tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let mut file = std::io::BufReader::new(file);
            let mut first = true;
            loop {
                let mut data = vec![0u8; BACKUP_CHUNK];
                let chunk = match file.read(&mut data) {
                    Ok(0) if !first => return,
                    Ok(n) => {
                        data.truncate(n);
                        let (applied_index, total_bytes) =
                            if first { (applied_index, total_bytes) } else { (0, 0) };
                        Ok(cairn_proto::BackupChunk { applied_index, total_bytes, data })
                    }
                    Err(e) => Err(CairnError::from_io("reading the backup", &e).into()),
                };
                first = false;
                let failed = chunk.is_err();
                if send.blocking_send(chunk).is_err() || failed {
                    return;
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(receive))
    }
}
