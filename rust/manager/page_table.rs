//! Page tables for the kernels: FlashInfer's CSR triple of a batch (whole sequences, or their first
//! tokens for a prefill chunk), vLLM's dense block table, and slot mappings.

use super::{KVCacheManager, SeqId, State};
use crate::error::{try_filled, try_with_capacity, KvError, KvResult};
use crate::NULL_PAGE;

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

impl PageTable {
    /// A zeroed table of `batch` rows and `total` indices, had fallibly: repeated ids make a table
    /// as large as the caller asks (`OutOfMemoryError`, never an aborted process).
    fn filled(batch: usize, total: usize) -> KvResult<Self> {
        Ok(Self {
            kv_indptr: try_filled(batch + 1, 0, "kv_indptr")?,
            kv_indices: try_filled(total, 0, "kv_indices")?,
            kv_last_page_len: try_filled(batch, 0, "kv_last_page_len")?,
        })
    }
}

/// What the kernels of one step read for a batch of rows (sequence `i` computes its tokens
/// `starts[i]..starts[i] + num_tokens[i]`), built by [`KVCacheManager::batch_layout`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchLayout {
    /// Each row's table covers its sequence's tokens up to its last computed one (what its
    /// attention reads: the cached prefix and the row's own tokens).
    pub table: PageTable,
    /// `[batch + 1]` int32: row `i`'s tokens are `q_indptr[i]..q_indptr[i + 1]` of the step.
    pub q_indptr: Vec<i32>,
    /// `[q_indptr[batch]]` int32: each token's position in its sequence.
    pub positions: Vec<i32>,
    /// `[q_indptr[batch]]` int64: each token's slot (`page_id * page_size + offset`).
    pub slot_mapping: Vec<i64>,
}

impl KVCacheManager {
    /// The page table of `seq_ids` (in order; repeats allowed), in fresh vectors. With
    /// `num_tokens` (`[batch]`), sequence `i`'s table covers only its first `num_tokens[i]` tokens
    /// (a prefill chunk: what the attention of that step may read); each must be in `1..=len`.
    /// Unknown ids or bad counts fail, nothing built.
    ///
    /// `group` picks the KV-cache group (caller order); its released pages are the null page,
    /// or, with `compact`, left out (then each kept token's position is in
    /// [`positions`](Self::positions); the last page must be kept).
    pub fn page_table(
        &self,
        seq_ids: &[SeqId],
        num_tokens: Option<&[usize]>,
        group: usize,
        compact: bool,
    ) -> KvResult<PageTable> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let total = self.page_table_len(&guard, seq_ids, num_tokens, g, compact)?;
        let mut table = PageTable::filled(seq_ids.len(), total)?;
        self.fill_page_table(
            &guard,
            seq_ids,
            num_tokens,
            (g, compact),
            &mut table.kv_indptr,
            &mut table.kv_indices,
            &mut table.kv_last_page_len,
        );
        Ok(table)
    }

    /// [`page_table`](Self::page_table) written into caller buffers (reused from step to step, so
    /// the scheduler's hot path allocates nothing). Returns the number of indices written. Fails,
    /// with nothing written, on an unknown id, a bad count or a buffer too short (`kv_indptr`
    /// needs `batch + 1`, `kv_last_page_len` `batch`, `kv_indices` the total number of pages).
    #[allow(clippy::too_many_arguments)]
    pub fn page_table_into(
        &self,
        seq_ids: &[SeqId],
        num_tokens: Option<&[usize]>,
        group: usize,
        compact: bool,
        kv_indptr: &mut [i32],
        kv_indices: &mut [i32],
        kv_last_page_len: &mut [i32],
    ) -> KvResult<usize> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let total = self.page_table_len(&guard, seq_ids, num_tokens, g, compact)?;
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
        self.fill_page_table(
            &guard,
            seq_ids,
            num_tokens,
            (g, compact),
            kv_indptr,
            kv_indices,
            kv_last_page_len,
        );
        Ok(total)
    }

    /// The dense block table of `seq_ids` (vLLM's and FlashAttention's format): row `i` holds
    /// sequence `i`'s pages, padded with the null page to the longest row. Returns the rows
    /// (`[batch * max_pages]`, row-major) and `max_pages`.
    pub fn block_table(&self, seq_ids: &[SeqId], group: usize) -> KvResult<(Vec<i32>, usize)> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let width = max_pages(&guard, seq_ids)?;
        // Repeated ids are allowed: the table may be far larger than the manager (a 2**20-page
        // sequence 50,000 times is 200 GB), so it is had fallibly, never by an aborting allocation.
        let len = seq_ids.len().checked_mul(width).ok_or_else(|| {
            KvError::OutOfMemory(format!(
                "cannot allocate a block table of {} rows of {width} pages",
                seq_ids.len()
            ))
        })?;
        let mut rows = try_filled(len, NULL_PAGE as i32, "the block table")?;
        fill_block_table(&guard, seq_ids, &mut rows, width, g);
        Ok((rows, width))
    }

    /// [`block_table`](Self::block_table) written into a caller buffer of rows of `row_len`
    /// entries (row-major, reused from step to step): rows `0..batch` are written, each padded
    /// with the null page up to `row_len`. Returns `max_pages`. Fails, with nothing written, on an
    /// unknown id or a buffer with too few rows or rows too short.
    pub fn block_table_into(
        &self,
        seq_ids: &[SeqId],
        out: &mut [i32],
        row_len: usize,
        group: usize,
    ) -> KvResult<usize> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let width = max_pages(&guard, seq_ids)?;
        let rows = out.len().checked_div(row_len).unwrap_or(0);
        if width > row_len || rows < seq_ids.len() {
            return Err(KvError::InvalidArgument(format!(
                "block table buffer too small: need {} rows of >= {width} entries, got {rows} rows \
                 of {row_len}",
                seq_ids.len()
            )));
        }
        fill_block_table(
            &guard,
            seq_ids,
            &mut out[..seq_ids.len() * row_len],
            row_len,
            g,
        );
        Ok(width)
    }

    /// Total pages of a batch's page table; fails on an unknown id, a count out of `1..=len`, a
    /// `num_tokens` of another length than the batch, or a total beyond int32.
    fn page_table_len(
        &self,
        st: &State,
        seq_ids: &[SeqId],
        num_tokens: Option<&[usize]>,
        g: usize,
        compact: bool,
    ) -> KvResult<usize> {
        if let Some(counts) = num_tokens {
            if counts.len() != seq_ids.len() {
                return Err(KvError::InvalidArgument(format!(
                    "num_tokens has {} entries for a batch of {}",
                    counts.len(),
                    seq_ids.len()
                )));
            }
        }
        let mut total = 0usize;
        for (i, &id) in seq_ids.iter().enumerate() {
            let seq = super::ready(&st.seqs, id)?;
            let len = seq.slots;
            if len == 0 {
                return Err(KvError::InvalidArgument(format!(
                    "sequence {id} has no slot reserved yet (reserve some of its prompt first)"
                )));
            }
            let n = num_tokens.map_or(len, |c| c[i]);
            if n == 0 || n > len {
                return Err(KvError::InvalidArgument(format!(
                    "num_tokens[{i}] must be in 1..={len} (the reserved tokens of sequence {id}), \
                     got {n}"
                )));
            }
            let pages = n.div_ceil(self.page_size);
            if compact {
                let table = &seq.table(g)[..pages];
                if table[pages - 1] == NULL_PAGE {
                    return Err(KvError::InvalidArgument(format!(
                        "sequence {id}: the page holding token {} was released, a compact table \
                         cannot end there",
                        n - 1
                    )));
                }
                total += table.iter().filter(|&&p| p != NULL_PAGE).count();
            } else {
                total += pages;
            }
        }
        if total > i32::MAX as usize {
            return Err(KvError::InvalidArgument(format!(
                "page table of {total} pages exceeds int32"
            )));
        }
        Ok(total)
    }

    /// Write a validated batch's CSR page table (see [`page_table_len`](Self::page_table_len)).
    #[allow(clippy::too_many_arguments)]
    fn fill_page_table(
        &self,
        st: &State,
        seq_ids: &[SeqId],
        num_tokens: Option<&[usize]>,
        (g, compact): (usize, bool),
        kv_indptr: &mut [i32],
        kv_indices: &mut [i32],
        kv_last_page_len: &mut [i32],
    ) {
        let ps = self.page_size;
        let mut at = 0usize;
        kv_indptr[0] = 0;
        for (i, id) in seq_ids.iter().enumerate() {
            let seq = &st.seqs[id];
            let tokens = num_tokens.map_or(seq.slots, |c| c[i]);
            let n = tokens.div_ceil(ps);
            let table = &seq.table(g)[..n];
            // Page ids are < num_pages <= i32::MAX, and the total fits int32 (page_table_len).
            if compact {
                for &page in table.iter().filter(|&&p| p != NULL_PAGE) {
                    kv_indices[at] = page as i32;
                    at += 1;
                }
            } else {
                for (dst, &page) in kv_indices[at..at + n].iter_mut().zip(table) {
                    *dst = page as i32;
                }
                at += n;
            }
            kv_indptr[i + 1] = at as i32;
            kv_last_page_len[i] = (tokens - (n - 1) * ps) as i32;
        }
    }

    /// The layout of one step's batch in one call (one lock): the page table of each row cut at
    /// its last computed token, the rows' token offsets, every token's position and slot. Row `i`
    /// computes tokens `starts[i]..starts[i] + num_tokens[i]` of `seq_ids[i]`: at least one, all
    /// reserved, none in a released page (a window group's). Fails, nothing built, otherwise, on an
    /// unknown or loading id, on lengths that differ from the batch's, or past int32.
    pub fn batch_layout(
        &self,
        seq_ids: &[SeqId],
        starts: &[usize],
        num_tokens: &[usize],
        group: usize,
    ) -> KvResult<BatchLayout> {
        let batch = seq_ids.len();
        if starts.len() != batch || num_tokens.len() != batch {
            return Err(KvError::InvalidArgument(format!(
                "batch_layout: {batch} sequences, {} starts and {} num_tokens",
                starts.len(),
                num_tokens.len()
            )));
        }
        let ps = self.page_size;
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let mut ends = try_with_capacity(batch, "the batch's row ends")?;
        let mut total = 0usize;
        for (i, (&id, (&start, &n))) in seq_ids
            .iter()
            .zip(starts.iter().zip(num_tokens))
            .enumerate()
        {
            let seq = super::ready(&guard.seqs, id)?;
            let len = seq.slots;
            let end = start.checked_add(n).filter(|&e| n > 0 && e <= len);
            let Some(end) = end else {
                return Err(KvError::InvalidArgument(format!(
                    "batch_layout: row {i} computes {n} tokens of sequence {id} from token {start}: \
                     it must compute at least one, within its {len} reserved tokens"
                )));
            };
            if end > i32::MAX as usize {
                return Err(KvError::InvalidArgument(format!(
                    "batch_layout: row {i} ends at token {end}, past int32 positions"
                )));
            }
            let table = seq.table(g);
            if let Some(p) = (start / ps..end.div_ceil(ps)).find(|&p| table[p] == NULL_PAGE) {
                return Err(KvError::InvalidArgument(format!(
                    "batch_layout: sequence {id}: page {p} (of tokens {start}..{end}) was released \
                     (outside the window, or compacted), its tokens have no slot"
                )));
            }
            total += n;
            ends.push(end);
        }
        if total > i32::MAX as usize {
            return Err(KvError::InvalidArgument(format!(
                "batch_layout: {total} tokens in the step exceed int32"
            )));
        }
        let pages = self.page_table_len(&guard, seq_ids, Some(&ends), g, false)?;
        let mut table = PageTable::filled(batch, pages)?;
        self.fill_page_table(
            &guard,
            seq_ids,
            Some(&ends),
            (g, false),
            &mut table.kv_indptr,
            &mut table.kv_indices,
            &mut table.kv_last_page_len,
        );
        let mut q_indptr = try_with_capacity(batch + 1, "q_indptr")?;
        let mut positions = try_with_capacity(total, "the step's positions")?;
        let mut slot_mapping = try_with_capacity(total, "the step's slot mapping")?;
        q_indptr.push(0);
        for (id, (&start, &end)) in seq_ids.iter().zip(starts.iter().zip(&ends)) {
            let table = guard.seqs[id].table(g);
            // No overflow: positions < i32::MAX (checked), slots < num_pages * page_size <= i64.
            for t in start..end {
                positions.push(t as i32);
                slot_mapping.push(i64::from(table[t / ps]) * ps as i64 + (t % ps) as i64);
            }
            q_indptr.push(positions.len() as i32);
        }
        Ok(BatchLayout {
            table,
            q_indptr,
            positions,
            slot_mapping,
        })
    }

    /// The slots (`page_id * page_size + offset`) of `num_tokens` tokens of `seq_id` starting at
    /// token `start` (`None`: the last `num_tokens` reserved). Fails, nothing built, if the range
    /// is not inside the reserved tokens.
    pub fn slot_mapping(
        &self,
        seq_id: SeqId,
        num_tokens: usize,
        start: Option<usize>,
        group: usize,
    ) -> KvResult<Vec<i64>> {
        let guard = self.state.lock();
        let g = guard.groups.internal(group)?;
        let seq = super::ready(&guard.seqs, seq_id)?;
        let len = seq.slots;
        let start = match start {
            None if num_tokens <= len => len - num_tokens,
            None => {
                return Err(KvError::InvalidArgument(format!(
                    "sequence {seq_id} has {len} reserved tokens, cannot map the last {num_tokens}"
                )))
            }
            Some(s) if s.checked_add(num_tokens).is_some_and(|end| end <= len) => s,
            Some(s) => {
                return Err(KvError::InvalidArgument(format!(
                    "sequence {seq_id} has {len} reserved tokens, cannot map {num_tokens} from token {s}"
                )))
            }
        };
        let ps = self.page_size;
        let table = seq.table(g);
        // Every page of the range, not only the first: a range may span a released middle.
        let pages = if num_tokens == 0 {
            &[][..]
        } else {
            &table[start / ps..(start + num_tokens - 1) / ps + 1]
        };
        if let Some(i) = pages.iter().position(|&p| p == NULL_PAGE) {
            let token = (start / ps + i) * ps;
            return Err(KvError::InvalidArgument(format!(
                "sequence {seq_id}: token {}'s page was released (outside the window, or \
                 compacted), it has no slot",
                token.max(start)
            )));
        }
        // No overflow: new() checks num_pages * page_size fits i64. A sequence's tokens may be
        // far more than the manager's memory (large pages): had fallibly.
        let mut out = try_with_capacity(num_tokens, "the slot mapping")?;
        out.extend(
            (start..start + num_tokens)
                .map(|t| i64::from(table[t / ps]) * ps as i64 + (t % ps) as i64),
        );
        Ok(out)
    }
}

/// The longest page table of a batch; fails on an unknown id.
fn max_pages(st: &State, seq_ids: &[SeqId]) -> KvResult<usize> {
    let mut width = 0;
    for &id in seq_ids {
        width = width.max(super::ready(&st.seqs, id)?.pages.len());
    }
    Ok(width)
}

/// Write validated rows of `row_len` entries: each sequence's pages, then null pages.
fn fill_block_table(st: &State, seq_ids: &[SeqId], rows: &mut [i32], row_len: usize, g: usize) {
    if row_len == 0 {
        return;
    }
    for (row, id) in rows.chunks_exact_mut(row_len).zip(seq_ids) {
        let pages = st.seqs[id].table(g);
        for (dst, &page) in row.iter_mut().zip(pages) {
            *dst = page as i32;
        }
        row[pages.len()..].fill(NULL_PAGE as i32);
    }
}
