package embedder

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/updates"
)

// Row updates (package updates) are written into the serving tables in
// place. Store.rows keeps them apart from lookups: every lookup job holds
// it for reading while it pools, and Apply holds it for writing while it
// copies a message's rows in. So each job sees a message's rows all
// before or all after it, no row is ever read half-written, and a
// message is visible to every job that starts after Apply returns, that
// is to every request admitted after the embedder acknowledges it.
// Quantizing and checking happen before the lock, so a writer holds it
// for a copy of at most updates.MaxRows rows.

// Updater is the scratch of the one goroutine that applies updates to a
// store: the decoded values and the quantized rows of a message, reused.
type Updater struct {
	vals []float32
	rows []byte
}

// Apply writes every row of msg into the tables, quantized to their
// precision by the export's rule (model.Dtype.QuantizeRow). A message
// with any bad row (width, table, id, value) is refused whole: the error
// names the row and what is wrong, and nothing is written.
func (s *Store) Apply(u *Updater, msg updates.Message) error {
	cfg := s.Config
	dim := cfg.EmbeddingDim
	if msg.Dim() != dim {
		return fmt.Errorf("embedder: update rows are %d wide, the model's are %d: %w", msg.Dim(), dim, updates.ErrEncoding)
	}
	rowB := s.Tables.RowBytes()
	n := msg.Len()
	if err := s.checkRows(msg); err != nil {
		return err
	}
	if cfg.TableDtype == model.DtypeFP32 {
		// A float32 row is stored as the message encodes it (the export's
		// rule writes the same bits): copy it straight in.
		for i := range n {
			if err := msg.CheckFinite(i); err != nil {
				return fmt.Errorf("embedder: %w", err)
			}
		}
		s.rows.Lock()
		for i := range n {
			t, id := msg.Row(i)
			copy(s.Tables.Row(t, id), msg.Raw(i))
		}
		s.rows.Unlock()
		return nil
	}
	if cap(u.vals) < dim {
		u.vals = make([]float32, dim)
	}
	if cap(u.rows) < n*rowB {
		u.rows = make([]byte, n*rowB)
	}
	vals, rows := u.vals[:dim], u.rows[:n*rowB]
	for i := range n {
		t, id := msg.Row(i)
		if err := msg.Values(i, vals); err != nil {
			return fmt.Errorf("embedder: %w", err)
		}
		if err := cfg.TableDtype.QuantizeRow(rows[i*rowB:(i+1)*rowB], vals); err != nil {
			return fmt.Errorf("embedder: update row %d (table %d, id %d): %w: %w", i, t, id, err, ErrBadUpdate)
		}
	}
	s.rows.Lock()
	for i := range n {
		t, id := msg.Row(i)
		copy(s.Tables.Row(t, id), rows[i*rowB:(i+1)*rowB])
	}
	s.rows.Unlock()
	return nil
}

// checkRows refuses a message naming a table or row the model lacks.
func (s *Store) checkRows(msg updates.Message) error {
	vocab := s.Config.VocabSizes
	for i := range msg.Len() {
		t, id := msg.Row(i)
		if t >= len(vocab) {
			return fmt.Errorf("embedder: update row %d: table %d, the model has %d: %w", i, t, len(vocab), ErrBadUpdate)
		}
		if id >= vocab[t] {
			return fmt.Errorf("embedder: update row %d: table %d has no row %d (%d rows): %w", i, t, id, vocab[t], ErrBadUpdate)
		}
	}
	return nil
}

// ErrBadUpdate is wrapped by Apply's refusals of rows the model does not
// have or cannot store.
var ErrBadUpdate = fmt.Errorf("update does not fit the model")

// TablesHash is a SHA-256 over every table's stored bytes, in table
// order: equal hashes mean bit-identical tables. It blocks updates, not
// lookups, while it reads.
func (s *Store) TablesHash() string {
	s.rows.RLock()
	defer s.rows.RUnlock()
	h := sha256.New()
	for i := range s.Tables.NumTables() {
		h.Write(s.Tables.Data(i))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// WriteSnapshot writes the serving tables, row updates included, as a new
// bundle at dir, which must not exist, with the dense parameters of the
// bundle the store was loaded from. applied gives the last update sequence the
// tables hold; it is read with updates held off, so the bundle's
// updates_seq is exact or (for a message applied but not yet counted) one
// behind, which a replay re-applies harmlessly. Updates wait while the
// snapshot is written; lookups do not.
func (s *Store) WriteSnapshot(dir string, applied func() uint64) (model.Config, error) {
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		return model.Config{}, fmt.Errorf("embedder: snapshot: %s exists (or cannot be checked: %v); name a new directory", dir, err)
	}
	b, err := model.Open(s.dir)
	if err != nil {
		return model.Config{}, fmt.Errorf("embedder: snapshot: %w", err)
	}
	defer b.Close()
	s.rows.RLock()
	defer s.rows.RUnlock()
	cfg := s.Config
	if applied != nil {
		cfg.UpdatesSeq = max(cfg.UpdatesSeq, applied())
	}
	tables := map[string]int{}
	for i, t := range cfg.Tables() {
		tables[t.Name] = i
	}
	err = model.WriteBundle(dir, cfg, func(name string) ([]byte, error) {
		if i, ok := tables[name]; ok {
			return s.Tables.Data(i), nil
		}
		return b.StoredBytes(name)
	})
	if err != nil {
		return model.Config{}, fmt.Errorf("embedder: snapshot: %w", err)
	}
	return cfg, nil
}
