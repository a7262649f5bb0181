package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ServingFile is the name, inside a model root, of the record of the model
// the mesh serves: the durable half of a rollout.
const ServingFile = "serving.json"

// Root is the one directory bundles may be loaded from at run time. A
// rollout names a bundle over the control plane; Root decides whether that
// name is acceptable, so a control-plane message can never make a process
// read a file outside it. It also keeps ServingFile, so a process that
// restarts comes back on the rolled-out model, not the one on its command
// line.
type Root struct {
	dir string // absolute, symlinks resolved
}

// OpenRoot resolves dir (which must exist and be a directory).
func OpenRoot(dir string) (Root, error) {
	if dir == "" {
		return Root{}, errors.New("model: model root is empty (set --model-root)")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Root{}, fmt.Errorf("model: model root %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return Root{}, fmt.Errorf("model: model root %s: %w", dir, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return Root{}, fmt.Errorf("model: model root %s: %w", dir, err)
	}
	if !st.IsDir() {
		return Root{}, fmt.Errorf("model: model root %s is not a directory", dir)
	}
	return Root{dir: real}, nil
}

// Dir is the root's absolute, symlink-free path.
func (r Root) Dir() string { return r.dir }

// ErrOutsideRoot is wrapped by Resolve's error for a name that leaves the
// root, directly, through "..", or through a symbolic link.
var ErrOutsideRoot = errors.New("outside the model root")

// Resolve turns a bundle name from a rollout request into the bundle's
// absolute path: a relative name is taken under the root, an absolute one
// must lie in it. The directory and every entry in it must resolve, after
// symbolic links, inside the root: a link planted in a bundle cannot make
// the loader map a file elsewhere.
func (r Root) Resolve(name string) (string, error) {
	if name == "" {
		return "", errors.New("model: empty bundle name")
	}
	if strings.ContainsRune(name, 0) {
		return "", errors.New("model: bundle name contains a NUL byte")
	}
	p := name
	if !filepath.IsAbs(p) {
		p = filepath.Join(r.dir, p)
	}
	p = filepath.Clean(p)
	if !r.contains(p) {
		return "", fmt.Errorf("model: bundle %s: %w %s", name, ErrOutsideRoot, r.dir)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("model: bundle %s: %w", name, err)
	}
	if !r.contains(real) {
		return "", fmt.Errorf("model: bundle %s: links to %s, %w %s", name, real, ErrOutsideRoot, r.dir)
	}
	if real == r.dir {
		return "", fmt.Errorf("model: bundle %s is the model root itself; name a bundle directory inside it", name)
	}
	entries, err := os.ReadDir(real)
	if err != nil {
		return "", fmt.Errorf("model: bundle %s: %w", name, err)
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(filepath.Join(real, e.Name()))
		if err != nil {
			return "", fmt.Errorf("model: bundle %s: %s: %w", name, e.Name(), err)
		}
		if !r.contains(target) {
			return "", fmt.Errorf("model: bundle %s: %s links to %s, %w %s", name, e.Name(), target, ErrOutsideRoot, r.dir)
		}
	}
	return real, nil
}

// NewBundle turns a name for a bundle about to be written (a snapshot)
// into its absolute path inside the root: like Resolve, but the bundle
// must not exist yet, and its parent must resolve inside the root.
func (r Root) NewBundle(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("model: bundle name %q is empty or holds a NUL byte", name)
	}
	p := name
	if !filepath.IsAbs(p) {
		p = filepath.Join(r.dir, p)
	}
	p = filepath.Clean(p)
	if !r.contains(p) || p == r.dir {
		return "", fmt.Errorf("model: bundle %s: %w %s", name, ErrOutsideRoot, r.dir)
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return "", fmt.Errorf("model: bundle %s: %w", name, err)
	}
	if !r.contains(parent) && parent != r.dir {
		return "", fmt.Errorf("model: bundle %s: its directory links to %s, %w %s", name, parent, ErrOutsideRoot, r.dir)
	}
	p = filepath.Join(parent, filepath.Base(p))
	if _, err := os.Lstat(p); err == nil {
		return "", fmt.Errorf("model: bundle %s already exists; name a new directory", name)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("model: bundle %s: %w", name, err)
	}
	return p, nil
}

func (r Root) contains(p string) bool {
	rel, err := filepath.Rel(r.dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// Serving is the record in ServingFile.
type Serving struct {
	// Bundle is the bundle's absolute path.
	Bundle string `json:"bundle"`
	// ModelID is the bundle's Config.ID(), for whoever reads the file.
	ModelID string    `json:"model_id"`
	Since   time.Time `json:"since"`
	// UpdatesBase is the row-update stream sequence the bundle includes
	// (its config's updates_seq); UpdatesApplied the last one the
	// embedder applied to its tables. A restarted embedder replays the
	// stream after UpdatesBase and serves only once it has reached
	// UpdatesApplied, so it never answers with older rows than it did.
	UpdatesBase    uint64 `json:"updates_base,omitempty"`
	UpdatesApplied uint64 `json:"updates_applied,omitempty"`
	// UpdatesOnly marks a record that no rollout wrote: the embedder
	// recorded how far row updates reached on the bundle it was started
	// on. Such a record does not pin the bundle: a process started with
	// another --bundle serves that one (and the record is not its own).
	UpdatesOnly bool `json:"updates_only,omitempty"`
}

// Serving reads the root's record of the serving model; ok is false when
// there is none (no rollout happened yet).
func (r Root) Serving() (s Serving, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(r.dir, ServingFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Serving{}, false, nil
	}
	if err != nil {
		return Serving{}, false, fmt.Errorf("model: read %s: %w", ServingFile, err)
	}
	if err := json.Unmarshal(b, &s); err != nil || s.Bundle == "" {
		return Serving{}, false, fmt.Errorf("model: %s in %s is corrupt (delete it to serve the --bundle flag's model): %v", ServingFile, r.dir, err)
	}
	return s, true, nil
}

// SetServing records s atomically: written to a temporary file, synced,
// renamed over ServingFile, and the directory synced, so a crash at any
// point leaves either the old record or the new one.
func (r Root) SetServing(s Serving) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(r.dir, ".serving-*.json")
	if err != nil {
		return fmt.Errorf("model: record serving model: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("model: record serving model: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("model: record serving model: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("model: record serving model: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(r.dir, ServingFile)); err != nil {
		return fmt.Errorf("model: record serving model: %w", err)
	}
	if d, err := os.Open(r.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// StartBundle is the bundle a process starts on: the rolled-out one the
// root records, or flagBundle when no rollout happened. A record naming a
// bundle that no longer resolves inside the root is an error: serving the
// flag's older model silently would split the mesh between two models.
func (r Root) StartBundle(flagBundle string) (dir string, resumed bool, err error) {
	s, ok, err := r.Serving()
	if err != nil || !ok || s.UpdatesOnly {
		return flagBundle, false, err
	}
	dir, err = r.Resolve(s.Bundle)
	if err != nil {
		return "", false, fmt.Errorf("%w (the rolled-out model recorded in %s; roll out another or delete that file to serve %s)",
			err, filepath.Join(r.dir, ServingFile), flagBundle)
	}
	return dir, true, nil
}
