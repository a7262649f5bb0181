package embedder

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/embedder/hugepage"
	"github.com/recmesh/recmesh/embedder/lookup"
	"github.com/recmesh/recmesh/model"
)

// Store is the one copy of the embedding tables in the mesh: every table of
// a bundle copied into a single huge-page region, and the lookup kernel's
// view of it. The bundle mapping is dropped once copied, so its page cache
// can go and the region is the only resident copy.
type Store struct {
	Config model.Config
	Tables *lookup.Tables
	region *hugepage.Region
	// Mode is the region's backing, PageSize the largest page the kernel
	// backs it with, and HugePageFraction how much of it is huge pages,
	// read back from /proc/self/smaps after the copy.
	Mode             hugepage.Mode
	PageSize         int
	HugePageFraction float64

	// dir is the bundle the tables were loaded from.
	dir string
	// rows keeps row updates and lookups apart (updates.go).
	rows sync.RWMutex
}

// LoadStore copies the tables of the bundle at dir into a huge-page region,
// at the precision the bundle stores them (model.Dtype): each table starts
// on a cache line (lookup.LayoutTablesOf) and is served by the best kernel
// for that precision.
func LoadStore(dir string) (*Store, error) {
	b, err := model.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("embedder: load tables: %w", err)
	}
	defer b.Close()
	cfg := b.Config
	size := lookup.TableBytesOf(cfg.TableDtype, cfg.VocabSizes)
	region, err := hugepage.Map(size, hugepage.Options{})
	if err != nil {
		return nil, fmt.Errorf("embedder: map %d-byte table region: %w", size, err)
	}
	data, err := lookup.LayoutTablesOf(cfg.TableDtype, region.Bytes(), cfg.VocabSizes)
	if err != nil {
		region.Close()
		return nil, fmt.Errorf("embedder: lay out %s tables: %w", cfg.TableDtype, err)
	}
	// One pass front to back: ask for read-ahead, and drop each table's
	// file pages once copied, so the page cache never holds more than one
	// table beside the region. A bundle bigger than half of the machine's
	// memory then loads with no second copy to reclaim (docs/design.md
	// says what a rollout of one needs).
	_ = b.Advise(unix.MADV_SEQUENTIAL)
	for i := range data {
		copy(data[i], b.TableData(i))
		if err := b.ReleaseTable(i); err != nil {
			region.Close()
			return nil, fmt.Errorf("embedder: load tables: %w", err)
		}
	}
	tables, err := lookup.NewTablesOf(cfg.TableDtype, data, cfg.Hotness)
	if err != nil {
		region.Close()
		return nil, fmt.Errorf("embedder: %s tables: %w", cfg.TableDtype, err)
	}
	frac, err := region.HugePageFraction()
	if err != nil {
		frac = 0
	}
	page, err := region.PageSize()
	if err != nil {
		page = 0
	}
	return &Store{dir: dir, Config: cfg, Tables: tables, region: region, Mode: region.Mode(), PageSize: page, HugePageFraction: frac}, nil
}

// Bytes is the size of the tables at their precision.
func (s *Store) Bytes() int64 { return s.Config.TableBytes() }

// Close unmaps the region; the store must not be used afterwards.
func (s *Store) Close() error { return s.region.Close() }
