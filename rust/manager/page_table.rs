//! Page tables for the kernels: FlashInfer's CSR triple of a batch, and slot mappings.

use super::{unknown, KVCacheManager, SeqId, State};
use crate::error::{KvError, KvResult};

/// FlashInfer's CSR page table of a batch, built by [`KVCacheManager::page_table`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageTable {
    /// `[batch + 1]` int32.
    pub kv_indptr: Vec<i32>,
    /// `[kv_indptr[batch]]` int32.
    pub kv_indices: Vec<i32>,
    /// `[batch]` int32, each in `1..=page_size`.
    pub kv_last_page_len: Vec<i32>,
}

impl KVCacheManager {
    /// The page table of `seq_ids` (in order; repeats allowed), in fresh vectors. Unknown ids fail.
    pub fn page_table(&self, seq_ids: &[SeqId]) -> KvResult<PageTable> {
        let mut table = PageTable::default();
        let guard = self.state.lock();
        let total = page_table_len(&guard, seq_ids)?;
        table.kv_indptr.resize(seq_ids.len() + 1, 0);
        table.kv_indices.resize(total, 0);
        table.kv_last_page_len.resize(seq_ids.len(), 0);
        self.fill_page_table(
            &guard,
            seq_ids,
            &mut table.kv_indptr,
            &mut table.kv_indices,
            &mut table.kv_last_page_len,
        );
        Ok(table)
    }

    /// The page table of `seq_ids` written into caller buffers (reused from step to step, so the
    /// scheduler's hot path allocates nothing). Returns the number of indices written. Fails, with
    /// nothing written, on an unknown id or a buffer too short (`kv_indptr` needs `batch + 1`,
    /// `kv_last_page_len` `batch`, `kv_indices` the total number of pages).
    pub fn page_table_into(
        &self,
        seq_ids: &[SeqId],
        kv_indptr: &mut [i32],
        kv_indices: &mut [i32],
        kv_last_page_len: &mut [i32],
    ) -> KvResult<usize> {
        let guard = self.state.lock();
        let total = page_table_len(&guard, seq_ids)?;
        let batch = seq_ids.len();
        if kv_indptr.len() < batch + 1 || kv_last_page_len.len() < batch || kv_indices.len() < total
        {
            return Err(KvError::InvalidArgument(format!(
                "page table buffers too short: need kv_indptr >= {}, kv_indices >= {total}, \
                 kv_last_page_len >= {batch}; got {}, {}, {}",
                batch + 1,
                kv_indptr.len(),
                kv_indices.len(),
                kv_last_page_len.len()
            )));
        }
        self.fill_page_table(&guard, seq_ids, kv_indptr, kv_indices, kv_last_page_len);
        Ok(total)
    }

    /// Write a validated batch's CSR page table (see [`page_table_len`]).
    fn fill_page_table(
        &self,
        st: &State,
        seq_ids: &[SeqId],
        kv_indptr: &mut [i32],
        kv_indices: &mut [i32],
        kv_last_page_len: &mut [i32],
    ) {
        let ps = self.page_size;
        let mut at = 0usize;
        kv_indptr[0] = 0;
        for (i, id) in seq_ids.iter().enumerate() {
            let seq = &st.seqs[id];
            let n = seq.pages.len();
            // Page ids are < num_pages <= i32::MAX, and the total fits int32 (page_table_len).
            for (dst, &page) in kv_indices[at..at + n].iter_mut().zip(&seq.pages) {
                *dst = page as i32;
            }
            at += n;
            kv_indptr[i + 1] = at as i32;
            kv_last_page_len[i] = (seq.tokens.len() - (n - 1) * ps) as i32;
        }
    }

    /// The slots (`page_id * page_size + offset`) of the last `num_tokens` tokens of `seq_id`.
    pub fn slot_mapping(&self, seq_id: SeqId, num_tokens: usize) -> KvResult<Vec<i64>> {
        let guard = self.state.lock();
        let seq = guard.seqs.get(&seq_id).ok_or_else(|| unknown(seq_id))?;
        let len = seq.tokens.len();
        if num_tokens > len {
            return Err(KvError::InvalidArgument(format!(
                "sequence {seq_id} has {len} tokens, cannot map the last {num_tokens}"
            )));
        }
        let ps = self.page_size;
        // No overflow: new() checks num_pages * page_size fits i64.
        Ok((len - num_tokens..len)
            .map(|t| i64::from(seq.pages[t / ps]) * ps as i64 + (t % ps) as i64)
            .collect())
    }
}

/// Total pages of a batch's page table; fails on an unknown id or a total beyond int32.
fn page_table_len(st: &State, seq_ids: &[SeqId]) -> KvResult<usize> {
    let mut total = 0usize;
    for &id in seq_ids {
        total += st.seqs.get(&id).ok_or_else(|| unknown(id))?.pages.len();
    }
    if total > i32::MAX as usize {
        return Err(KvError::InvalidArgument(format!(
            "page table of {total} pages exceeds int32"
        )));
    }
    Ok(total)
}
