package meshnats

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

// refusalWait bounds an operation the server is expected to refuse: a
// refused publish or API request is dropped, so the client only times out.
const refusalWait = 500 * time.Millisecond

// violations collects a client's asynchronous errors: a refused publish or
// subscription arrives there as a permissions violation naming the
// subject.
type violations chan error

// expect waits until a permissions violation naming subject arrives.
func (v violations) expect(t *testing.T, who, subject string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-v:
			if isViolation(err) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-timeout:
			t.Errorf("%s: the server reported no permissions violation for %s", who, subject)
			return
		}
	}
}

func isViolation(err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation")
}

// jsAs connects as role with its violations collected.
func jsAs(t *testing.T, url string, ids *Identities, role control.Role) (*nats.Conn, jetstream.JetStream, violations) {
	t.Helper()
	errs := make(violations, 64)
	nc := connectAs(t, url, ids, role, errs)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, errs
}

// denseObject is an object of several chunks (the object store's are 128
// KiB), so Get and Watch run their ordered consumers through more than one
// delivery and flow control.
func denseObject(version byte) []byte {
	b := make([]byte, 3<<20+17)
	for i := range b {
		b[i] = byte(i*7) ^ version
	}
	return b
}

// checkJetStream proves each role's fresh-embedding permissions against a
// real JetStream server: what a role needs works, and what it must not do
// is refused by the server (not merely left undone by the client).
func checkJetStream(t *testing.T, url string, ids *Identities) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	subject, err := updates.RowsSubject("m1")
	if err != nil {
		t.Fatal(err)
	}
	rows := []updates.Row{{Table: 3, ID: 7, Values: []float32{1, 2, 3, 4}}, {Table: 0, ID: 0, Values: []float32{-1, 0, 0.5, 9}}}
	payload, err := updates.Append(nil, 4, rows)
	if err != nil {
		t.Fatal(err)
	}

	// The trainer creates the stream, publishes with an acknowledgement,
	// creates the dense bucket and puts an object, twice (a Put over an
	// object purges its old chunks).
	_, trainer, trainerErrs := jsAs(t, url, ids, control.RoleTrainer)
	if _, err := trainer.Stream(ctx, updates.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("trainer: stream info before any stream: %v; want stream not found", err)
	}
	if _, err := trainer.CreateStream(ctx, updates.StreamConfig(0)); err != nil {
		t.Fatalf("trainer: create %s: %v", updates.Stream, err)
	}
	ack, err := trainer.Publish(ctx, subject, payload, jetstream.WithMsgID("push-1"))
	if err != nil {
		t.Fatalf("trainer: publish %s: %v", subject, err)
	}
	if ack.Stream != updates.Stream || ack.Sequence != 1 {
		t.Errorf("trainer: publish acknowledged as %+v; want %s sequence 1", ack, updates.Stream)
	}
	obs, err := trainer.ObjectStore(ctx, updates.DenseBucket)
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("trainer: object store before any bucket: %v; want bucket not found", err)
	}
	if obs, err = trainer.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: updates.DenseBucket, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("trainer: create bucket %s: %v", updates.DenseBucket, err)
	}
	var put *jetstream.ObjectInfo
	for v := byte(1); v <= 2; v++ {
		if put, err = obs.PutBytes(ctx, "m1", denseObject(v)); err != nil {
			t.Fatalf("trainer: put m1 version %d: %v", v, err)
		}
	}
	// The second Put purged the first one's chunks (the client ignores a
	// refused purge, so only the stream tells).
	if st, err := obs.Status(ctx); err != nil {
		t.Errorf("trainer: bucket status: %v", err)
	} else if si := st.(*jetstream.ObjectBucketStatus).StreamInfo(); si.State.Msgs != uint64(put.Chunks)+1 {
		t.Errorf("trainer: the bucket holds %d messages after replacing m1; want its %d chunks and its meta", si.State.Msgs, put.Chunks)
	}
	// Nothing else: no stream deletion, no reading the updates back, no
	// control-plane rollout.
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, refusalWait) }
	c, cc := short()
	if err := trainer.DeleteStream(c, updates.Stream); err == nil {
		t.Error("trainer deleted the updates stream")
	}
	cc()
	trainerErrs.expect(t, "trainer", "$JS.API.STREAM.DELETE."+updates.Stream)
	c, cc = short()
	if _, err := trainer.CreateOrUpdateConsumer(c, updates.Stream, jetstream.ConsumerConfig{Durable: "spy"}); err == nil {
		t.Error("trainer created a consumer on the updates stream")
	}
	cc()
	trainerErrs.expect(t, "trainer", "$JS.API.CONSUMER.CREATE."+updates.Stream)
	c, cc = short()
	if _, err := trainer.UpdateStream(c, updates.StreamConfig(1)); err == nil {
		t.Error("trainer changed the updates stream's limits")
	}
	cc()
	trainerErrs.expect(t, "trainer", "$JS.API.STREAM.UPDATE."+updates.Stream)

	// The embedder consumes the model's subject with a durable pull
	// consumer, reads a message by sequence, and acknowledges what it
	// applied.
	embedderNC, embedder, embedderErrs := jsAs(t, url, ids, control.RoleEmbedder)
	stream, err := embedder.Stream(ctx, updates.Stream)
	if err != nil {
		t.Fatalf("embedder: stream info: %v", err)
	}
	if _, err := embedder.CreateStream(ctx, updates.StreamConfig(0)); err != nil {
		// Same configuration: JetStream answers with the existing stream.
		t.Errorf("embedder: create the existing stream with the same configuration: %v", err)
	}
	cons, err := embedder.CreateOrUpdateConsumer(ctx, updates.Stream, jetstream.ConsumerConfig{
		Durable: "recmesh-embedder-m1", FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		t.Fatalf("embedder: durable pull consumer on %s: %v", subject, err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatalf("embedder: fetch: %v", err)
	}
	got := 0
	for m := range batch.Messages() {
		got++
		msg, err := updates.Decode(m.Data())
		if err != nil || msg.Len() != len(rows) {
			t.Errorf("embedder: fetched %d rows, %v; want %d", msg.Len(), err, len(rows))
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Errorf("embedder: ack: %v", err)
		}
	}
	if batch.Error() != nil || got != 1 {
		t.Errorf("embedder: fetched %d messages, %v; want 1", got, batch.Error())
	}
	if info, err := cons.Info(ctx); err != nil || info.AckFloor.Stream != 1 || info.NumAckPending != 0 {
		t.Errorf("embedder: consumer info %+v, %v; want everything up to 1 acknowledged", info, err)
	}
	if raw, err := stream.GetMsg(ctx, 1); err != nil || !bytes.Equal(raw.Data, payload) {
		t.Errorf("embedder: get message 1: %v", err)
	}
	if err := embedder.DeleteConsumer(ctx, updates.Stream, "recmesh-embedder-m1"); err != nil {
		t.Errorf("embedder: delete its consumer: %v", err)
	}
	// Older clients create durables through CONSUMER.DURABLE.CREATE.
	legacy, err := embedderNC.JetStream(nats.UseLegacyDurableConsumers(), nats.Context(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := legacy.AddConsumer(updates.Stream, &nats.ConsumerConfig{
		Durable: "recmesh-embedder-legacy", FilterSubject: subject, AckPolicy: nats.AckExplicitPolicy,
	}); err != nil {
		t.Errorf("embedder: durable consumer through DURABLE.CREATE: %v", err)
	} else if err := legacy.DeleteConsumer(updates.Stream, "recmesh-embedder-legacy"); err != nil {
		t.Errorf("embedder: delete the legacy durable: %v", err)
	}
	// It may not publish updates itself, nor touch the dense weights.
	c, cc = short()
	if _, err := embedder.Publish(c, subject, payload); err == nil {
		t.Error("the embedder published a row update")
	}
	cc()
	embedderErrs.expect(t, "embedder", subject)
	c, cc = short()
	if _, err := embedder.ObjectStore(c, updates.DenseBucket); err == nil {
		t.Error("the embedder opened the dense bucket")
	}
	cc()
	embedderErrs.expect(t, "embedder", "$JS.API.STREAM.INFO.OBJ_"+updates.DenseBucket)

	// The accelerator reads and watches the dense object.
	_, accelerator, acceleratorErrs := jsAs(t, url, ids, control.RoleAccelerator)
	aobs, err := accelerator.ObjectStore(ctx, updates.DenseBucket)
	if err != nil {
		t.Fatalf("accelerator: open bucket %s: %v", updates.DenseBucket, err)
	}
	info, err := aobs.GetInfo(ctx, "m1")
	if err != nil || info.Size != uint64(len(denseObject(2))) || info.Chunks < 2 {
		t.Fatalf("accelerator: info of m1 %+v, %v; want version 2's size in several chunks", info, err)
	}
	if b, err := aobs.GetBytes(ctx, "m1"); err != nil || !bytes.Equal(b, denseObject(2)) {
		t.Fatalf("accelerator: get m1: %d bytes, %v; want version 2", len(b), err)
	}
	w, err := aobs.Watch(ctx)
	if err != nil {
		t.Fatalf("accelerator: watch: %v", err)
	}
	defer w.Stop()
	next := func() *jetstream.ObjectInfo {
		select {
		case u := <-w.Updates():
			return u
		case <-ctx.Done():
			t.Fatal("accelerator: the watch delivered nothing")
			return nil
		}
	}
	if u := next(); u == nil || u.Name != "m1" || u.NUID != info.NUID {
		t.Fatalf("accelerator: first watch entry %+v; want m1 as it is", u)
	}
	if u := next(); u != nil {
		t.Fatalf("accelerator: watch entry %+v; want the end of the initial values", u)
	}
	put, err = obs.PutBytes(ctx, "m1", denseObject(3))
	if err != nil {
		t.Fatalf("trainer: put m1 version 3: %v", err)
	}
	if u := next(); u == nil || u.NUID != put.NUID {
		t.Fatalf("accelerator: watch entry %+v; want the new m1 (%s)", u, put.NUID)
	}
	if b, err := aobs.GetBytes(ctx, "m1"); err != nil || !bytes.Equal(b, denseObject(3)) {
		t.Fatalf("accelerator: get the new m1: %d bytes, %v", len(b), err)
	}
	// It may read, not write.
	c, cc = short()
	if _, err := aobs.PutBytes(c, "m1", []byte("not weights")); err == nil {
		t.Error("the accelerator put an object")
	}
	cc()
	acceleratorErrs.expect(t, "accelerator", "$O."+updates.DenseBucket+".")
	c, cc = short()
	if _, err := accelerator.Publish(c, subject, payload); err == nil {
		t.Error("the accelerator published a row update")
	}
	cc()
	acceleratorErrs.expect(t, "accelerator", subject)

	// A frontend may do none of it.
	frontendNC, frontend, frontendErrs := jsAs(t, url, ids, control.RoleFrontend)
	c, cc = short()
	if _, err := frontend.Publish(c, subject, payload); err == nil {
		t.Error("a frontend published a row update")
	}
	cc()
	frontendErrs.expect(t, "frontend", subject)
	// Without an acknowledgement, nor through a plain publish.
	if err := frontendNC.Publish(subject, payload); err != nil {
		t.Fatal(err)
	}
	frontendErrs.expect(t, "frontend", subject)
	c, cc = short()
	if _, err := frontend.ObjectStore(c, updates.DenseBucket); err == nil {
		t.Error("a frontend opened the dense bucket")
	}
	cc()
	frontendErrs.expect(t, "frontend", "$JS.API.STREAM.INFO.OBJ_"+updates.DenseBucket)
	// Even with a bucket handle (the accelerator's connection is not the
	// frontend's; the frontend goes straight at the chunk subjects).
	if err := frontendNC.Publish("$O."+updates.DenseBucket+".M.bTE", []byte(`{"name":"m1"}`)); err != nil {
		t.Fatal(err)
	}
	frontendErrs.expect(t, "frontend", "$O."+updates.DenseBucket+".M.bTE")
	if err := frontendNC.Flush(); err != nil {
		t.Fatal(err)
	}

	// Nothing the refused clients sent reached the streams.
	if si, err := stream.Info(ctx); err != nil || si.State.Msgs != 1 || si.State.LastSeq != 1 {
		t.Errorf("updates stream %+v, %v; want only the trainer's message", si.State, err)
	}
	if b, err := aobs.GetBytes(ctx, "m1"); err != nil || !bytes.Equal(b, denseObject(3)) {
		t.Errorf("m1 after the refused puts: %d bytes, %v; want the trainer's version 3", len(b), err)
	}
}

// TestJetStreamRoles runs the fresh-embedding permissions against the
// embedded server.
func TestJetStreamRoles(t *testing.T) {
	s, err := StartWith(Options{Parent: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	checkJetStream(t, s.ClientURL(), s.Identities)
}

// TestStoreOutlivesServer: given a store directory, the row updates
// survive a restart of the server, and a second server is refused the
// directory while the first runs.
func TestStoreOutlivesServer(t *testing.T) {
	store := filepath.Join(t.TempDir(), ".jetstream")
	s, err := StartWith(Options{Parent: t.TempDir(), StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := StartWith(Options{Parent: t.TempDir(), StoreDir: store}); !errors.Is(err, ErrStoreInUse) {
		t.Errorf("a second server on the same store: %v; want %v", err, ErrStoreInUse)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js, _ := jsAs(t, s.ClientURL(), s.Identities, control.RoleTrainer)
	if _, err := js.CreateStream(ctx, updates.StreamConfig(0)); err != nil {
		t.Fatal(err)
	}
	subject, _ := updates.RowsSubject("m1")
	payload, _ := updates.Append(nil, 2, []updates.Row{{Table: 1, ID: 2, Values: []float32{3, 4}}})
	for i := range 3 {
		if _, err := js.Publish(ctx, subject, payload, jetstream.WithMsgID(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	s.Shutdown()

	s, err = StartWith(Options{Parent: t.TempDir(), StoreDir: store})
	if err != nil {
		t.Fatalf("restart on the same store: %v", err)
	}
	defer s.Shutdown()
	// New identities: the streams belong to the server, not to a key.
	_, js, _ = jsAs(t, s.ClientURL(), s.Identities, control.RoleEmbedder)
	st, err := js.Stream(ctx, updates.Stream)
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if si, err := st.Info(ctx); err != nil || si.State.Msgs != 3 || si.State.LastSeq != 3 {
		t.Errorf("after a restart the stream holds %+v, %v; want the 3 messages", si.State, err)
	}
}
