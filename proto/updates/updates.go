// Package updates owns the wire contract of fresh embeddings: the
// JetStream stream a trainer publishes row updates to, the subject of each
// model's updates, the binary encoding of a message of rows, and the
// object store bucket that carries new dense weights. The embedder
// consumes the stream, `recmesh update push` and trainers publish to it;
// both sides agree only through this package.
//
// # Encoding
//
// A message is little-endian binary:
//
//	offset 0   magic   "RMU1"
//	offset 4   dim     uint32, floats per row (the model's embedding width)
//	offset 8   count   uint32, rows in the message (1..MaxRows)
//	offset 12  count records of 8 + 4·dim bytes each:
//	           table   uint32, the table's index in the model (0-based)
//	           row     uint32, the row's id within that table
//	           values  dim × float32 (IEEE 754 binary32)
//
// Nothing follows the last record. The rows are float32 whatever the
// serving tables' precision: the embedder quantizes them as the export
// does (model.Dtype.QuantizeRow). A message is applied whole or refused
// whole.
package updates

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream is the JetStream stream of row updates, one for every model.
const Stream = "RECMESH_UPDATES"

// SubjectPrefix starts every row-update subject; RowsSubject appends the
// model.
const SubjectPrefix = "recmesh.updates.rows."

// DenseBucket is the JetStream object store bucket of dense weights: one
// object per model id, its content a safetensors file of the model's dense
// parameters (the bundle's dense tensors, same names and shapes).
const DenseBucket = "recmesh-dense"

// Magic starts every message.
const Magic = "RMU1"

// HeaderBytes is the size of a message's header.
const HeaderBytes = 12

// MaxRows bounds the rows of one message, so one stays under NATS's
// default 1 MiB payload at width 128 (MaxRows · 520 bytes = 532 KiB).
const MaxRows = 1024

// Errors a decoder wraps, so a consumer can count refusals by cause.
var (
	ErrEncoding = errors.New("malformed update message")
	ErrValue    = errors.New("value is NaN or infinite")
)

// RowsSubject is the subject of modelID's row updates. A model id is one
// subject token: no dots, spaces or wildcards.
func RowsSubject(modelID string) (string, error) {
	if modelID == "" || strings.ContainsAny(modelID, ".*> \t\r\n") {
		return "", fmt.Errorf("updates: model id %q cannot be a subject token (no dots, spaces or wildcards)", modelID)
	}
	return SubjectPrefix + modelID, nil
}

// StreamConfig is the stream's configuration: file storage, so updates
// outlive a NATS restart, and limits-based retention, since a restarted
// embedder replays from the sequence its bundle includes. maxBytes bounds
// the stream (0: unlimited); when old updates are dropped, an embedder
// whose bundle predates them refuses to start and asks for a snapshot.
func StreamConfig(maxBytes int64) jetstream.StreamConfig {
	if maxBytes == 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "recmesh embedding row updates, one subject per model",
		Subjects:    []string{SubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxBytes:    maxBytes,
		// A full message at width 128, plus room for headers (message
		// ids, trace context), which JetStream counts against the limit.
		MaxMsgSize: HeaderBytes + MaxRows*(8+4*128) + 16<<10,
		Duplicates: 2 * time.Minute,
	}
}

// RecordBytes is the size of one row's record at width dim.
func RecordBytes(dim int) int { return 8 + 4*dim }

// Row is one row update.
type Row struct {
	Table  int
	ID     int
	Values []float32
}

// Append encodes rows (all of width dim) as one message appended to dst.
func Append(dst []byte, dim int, rows []Row) ([]byte, error) {
	if len(rows) == 0 || len(rows) > MaxRows {
		return dst, fmt.Errorf("updates: %d rows in one message, want 1..%d", len(rows), MaxRows)
	}
	dst = append(dst, Magic...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(dim))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(rows)))
	for i, r := range rows {
		if len(r.Values) != dim {
			return dst, fmt.Errorf("updates: row %d has %d values, want %d", i, len(r.Values), dim)
		}
		if r.Table < 0 || r.Table > math.MaxUint32 || r.ID < 0 || r.ID > math.MaxUint32 {
			return dst, fmt.Errorf("updates: row %d: table %d, id %d out of the encoding's range", i, r.Table, r.ID)
		}
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Table))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r.ID))
		for _, v := range r.Values {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	}
	return dst, nil
}

// Message is a decoded view of an encoded message: it keeps the bytes and
// reads rows from them on demand, so decoding copies nothing.
type Message struct {
	b     []byte
	dim   int
	count int
}

// Decode checks the framing of b: magic, width, count and length. It does
// not look at the values (Values reports NaN and infinities).
func Decode(b []byte) (Message, error) {
	if len(b) < HeaderBytes {
		return Message{}, fmt.Errorf("updates: %d bytes, shorter than the %d-byte header: %w", len(b), HeaderBytes, ErrEncoding)
	}
	if string(b[:4]) != Magic {
		return Message{}, fmt.Errorf("updates: magic %q, want %q: %w", b[:4], Magic, ErrEncoding)
	}
	dim := binary.LittleEndian.Uint32(b[4:])
	count := binary.LittleEndian.Uint32(b[8:])
	if dim == 0 || dim > 1<<16 {
		return Message{}, fmt.Errorf("updates: width %d: %w", dim, ErrEncoding)
	}
	if count == 0 || count > MaxRows {
		return Message{}, fmt.Errorf("updates: %d rows, want 1..%d: %w", count, MaxRows, ErrEncoding)
	}
	if want := HeaderBytes + int(count)*RecordBytes(int(dim)); len(b) != want {
		return Message{}, fmt.Errorf("updates: %d bytes for %d rows of width %d, want %d: %w", len(b), count, dim, want, ErrEncoding)
	}
	return Message{b: b, dim: int(dim), count: int(count)}, nil
}

// Dim is the width of every row in the message.
func (m Message) Dim() int { return m.dim }

// Len is the number of rows.
func (m Message) Len() int { return m.count }

// Row returns row i's table and id.
func (m Message) Row(i int) (table, id int) {
	r := m.b[HeaderBytes+i*RecordBytes(m.dim):]
	return int(binary.LittleEndian.Uint32(r)), int(binary.LittleEndian.Uint32(r[4:]))
}

// Values decodes row i's values into dst (len Dim) and fails, naming the
// row and the position, on a NaN or an infinity.
func (m Message) Values(i int, dst []float32) error {
	r := m.Raw(i)
	for j := range dst[:m.dim] {
		b := binary.LittleEndian.Uint32(r[4*j:])
		if b&expMask == expMask {
			return m.nonFinite(i, j, b)
		}
		dst[j] = math.Float32frombits(b)
	}
	return nil
}

// Raw returns row i's values as the message encodes them: little-endian
// float32, 4·Dim bytes, a view of the message.
func (m Message) Raw(i int) []byte {
	at := HeaderBytes + i*RecordBytes(m.dim) + 8
	return m.b[at : at+4*m.dim : at+4*m.dim]
}

// CheckFinite fails, as Values does, when row i holds a NaN or an
// infinity; it decodes nothing, for a caller that copies Raw as it is.
func (m Message) CheckFinite(i int) error {
	r := m.Raw(i)
	// Two floats a word: adding one to an exponent of all ones carries
	// into the lane's sign bit, and into it only.
	const exps, one, signs = expMask<<32 | expMask, 1<<55 | 1<<23, 1<<63 | 1<<31
	// Four words an iteration, into separate accumulators, keep the
	// loads independent (the check runs on the core that serves lookups).
	var bad, b1, b2, b3 uint64
	j := 0
	for ; j+32 <= len(r); j += 32 {
		w := r[j : j+32 : j+32]
		bad |= (binary.LittleEndian.Uint64(w)&exps + one) & signs
		b1 |= (binary.LittleEndian.Uint64(w[8:])&exps + one) & signs
		b2 |= (binary.LittleEndian.Uint64(w[16:])&exps + one) & signs
		b3 |= (binary.LittleEndian.Uint64(w[24:])&exps + one) & signs
	}
	for ; j+8 <= len(r); j += 8 {
		bad |= (binary.LittleEndian.Uint64(r[j:])&exps + one) & signs
	}
	bad |= b1 | b2 | b3
	if bad == 0 && j == len(r) {
		return nil
	}
	for j := 0; j < len(r); j += 4 { // find and name it
		if b := binary.LittleEndian.Uint32(r[j:]); b&expMask == expMask {
			return m.nonFinite(i, j/4, b)
		}
	}
	return nil
}

// expMask is a float32's exponent: all ones is an infinity or a NaN.
const expMask = 0x7f800000

func (m Message) nonFinite(i, j int, b uint32) error {
	return fmt.Errorf("updates: row %d, value %d is %v: %w", i, j, math.Float32frombits(b), ErrValue)
}
