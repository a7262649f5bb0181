package grpcwire

import (
	"bytes"
	"encoding/base64"
	"math"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

func TestTimeoutRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0n"},
		{0, "0n"},
		{time.Nanosecond, "1n"},
		{50 * time.Millisecond, "50000000n"},
		{99999999 * time.Nanosecond, "99999999n"},
		{100 * time.Millisecond, "100000u"},
		{100*time.Millisecond + time.Nanosecond, "100001u"},
		{99999999 * time.Microsecond, "99999999u"},
		{99999999*time.Microsecond + 1, "100000m"},
		{10 * time.Second, "10000000u"},
		{100*time.Second + time.Nanosecond, "100001m"},
		{99999999 * time.Millisecond, "99999999m"},
		{99999999*time.Millisecond + 1, "100000S"},
		{99999999 * time.Second, "99999999S"},
		{99999999*time.Second + 1, "1666667M"},
		{200 * time.Hour, "720000S"},
		{99999999 * time.Minute, "99999999M"},
		{99999999*time.Minute + 1, "1666667H"},
		{math.MaxInt64, "2562048H"},
	} {
		got := EncodeTimeout(tc.d)
		if got != tc.want {
			t.Errorf("EncodeTimeout(%v) = %s, want %s", tc.d, got, tc.want)
		}
		if string(AppendTimeout([]byte("x"), tc.d)) != "x"+tc.want {
			t.Errorf("AppendTimeout(%v) differs from EncodeTimeout", tc.d)
		}
		// The server never sees a shorter deadline, nor one a unit longer.
		d, ok := ParseTimeout(got)
		if !ok || d < max(tc.d, 0) {
			t.Errorf("ParseTimeout(%q) = %v, %v: want at least %v", got, d, ok, tc.d)
			continue
		}
		for _, u := range timeoutUnits {
			if u.c == got[len(got)-1] && tc.d > 0 && d-tc.d >= u.d {
				t.Errorf("ParseTimeout(%q) = %v: rounded up by a unit or more from %v", got, d, tc.d)
			}
		}
	}
}

func TestParseTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"1S": time.Second, "250m": 250 * time.Millisecond, "7u": 7 * time.Microsecond, "3H": 3 * time.Hour,
		"2M": 2 * time.Minute, "99999999n": 99999999, "0n": 0, "00000001S": time.Second,
		"99999999H": math.MaxInt64, "2562048H": math.MaxInt64, "2562047H": 2562047 * time.Hour,
	} {
		if d, ok := ParseTimeout(in); !ok || d != want {
			t.Errorf("ParseTimeout(%q) = %v, %v, want %v", in, d, ok, want)
		}
	}
	for _, bad := range []string{"", "S", "1", "1x", "1s", "1h", "-1S", "123456789S", "1.5S", " 1S", "1S ", "0x1S", "S1"} {
		if _, ok := ParseTimeout(bad); ok {
			t.Errorf("ParseTimeout(%q) accepted", bad)
		}
	}
}

// messages are grpc-message cases: every byte class the encoding treats
// apart, and text that looks encoded already.
var messages = []string{
	"", "plain words", "bad input: 100% wrong\nsecond line", "ünïcode ✓ 🚀", "tab\tcr\rnul\x00del\x7f",
	"%", "%%", "%25 is literal", "%zz%4", "~ !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}", "\xff\xfe invalid utf-8",
}

func TestMessageRoundTrip(t *testing.T) {
	for _, msg := range messages {
		enc := EncodeMessage(msg)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; c < ' ' || c > '~' {
				t.Errorf("EncodeMessage(%q) = %q: byte %#x left unencoded", msg, enc, c)
			}
		}
		if got := DecodeMessage(enc); got != msg {
			t.Errorf("DecodeMessage(EncodeMessage(%q)) = %q", msg, got)
		}
	}
	if got := EncodeMessage("a 100% é\n"); got != "a 100%25 %C3%A9%0A" {
		t.Errorf("EncodeMessage = %q", got)
	}
	// What no conforming sender writes comes back as it came.
	for _, v := range []string{"%", "50%", "%zz", "a%20b%2"} {
		if got := DecodeMessage(v); got != v {
			t.Errorf("DecodeMessage(%q) = %q, want it unchanged", v, got)
		}
	}
	if got := DecodeMessage("%c3%a9+%41"); got != "é+A" {
		t.Errorf("DecodeMessage of lower-case hex and '+' = %q", got)
	}
}

func TestPrefix(t *testing.T) {
	var p [PrefixLen]byte
	for _, tc := range []struct {
		compressed bool
		n          uint32
		want       []byte
	}{
		{false, 0, []byte{0, 0, 0, 0, 0}},
		{false, 0x01020304, []byte{0, 1, 2, 3, 4}},
		{true, math.MaxUint32, []byte{1, 0xff, 0xff, 0xff, 0xff}},
	} {
		PutPrefix(p[:], tc.compressed, tc.n)
		if !bytes.Equal(p[:], tc.want) {
			t.Errorf("PutPrefix(%v, %d) = %v, want %v", tc.compressed, tc.n, p, tc.want)
		}
		if c, n := ParsePrefix(p[:]); c != tc.compressed || n != tc.n {
			t.Errorf("ParsePrefix(%v) = %v, %d", p, c, n)
		}
	}
	if c, _ := ParsePrefix([]byte{2, 0, 0, 0, 0, 'x'}); !c {
		t.Error("ParsePrefix: flag 2 read as uncompressed")
	}
}

func TestDecodeBinHeader(t *testing.T) {
	for _, v := range []string{"", "\x00", "\x00\x01", "\x00\x01\x02", "\xff\xfe\xfd\xfc", "any bytes at all"} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
			s := enc.EncodeToString([]byte(v))
			if got, err := DecodeBinHeader(s); err != nil || string(got) != v {
				t.Errorf("DecodeBinHeader(%q) = %q, %v, want %q", s, got, err, v)
			}
		}
	}
	for _, bad := range []string{"A", "AB=C", "****", "AA=", "AA==="} {
		if got, err := DecodeBinHeader(bad); err == nil {
			t.Errorf("DecodeBinHeader(%q) = %q, accepted", bad, got)
		}
	}
}

func TestCodeMappings(t *testing.T) {
	for e, want := range map[http2.ErrCode]codes.Code{
		http2.ErrCodeNo: codes.Internal, http2.ErrCodeProtocol: codes.Internal, http2.ErrCodeFlowControl: codes.Internal,
		http2.ErrCodeRefusedStream: codes.Unavailable, http2.ErrCodeCancel: codes.Canceled,
		http2.ErrCodeEnhanceYourCalm: codes.ResourceExhausted, http2.ErrCodeInadequateSecurity: codes.PermissionDenied,
		http2.ErrCodeHTTP11Required: codes.Internal, 0x77: codes.Internal,
	} {
		if got := ResetCode(e); got != want {
			t.Errorf("ResetCode(%v) = %v, want %v", e, got, want)
		}
	}
	for h, want := range map[int]codes.Code{
		400: codes.Internal, 401: codes.Unauthenticated, 403: codes.PermissionDenied, 404: codes.Unimplemented,
		429: codes.Unavailable, 502: codes.Unavailable, 503: codes.Unavailable, 504: codes.Unavailable,
		200: codes.Unknown, 405: codes.Unknown, 500: codes.Unknown,
	} {
		if got := HTTPStatusCode(h); got != want {
			t.Errorf("HTTPStatusCode(%d) = %v, want %v", h, got, want)
		}
	}
}

func TestNoAllocations(t *testing.T) {
	var buf [16]byte
	var p [PrefixLen]byte
	clean := strings.Repeat("clean message ", 8)
	if n := testing.AllocsPerRun(100, func() {
		_ = AppendTimeout(buf[:0], 1500*time.Millisecond)
		PutPrefix(p[:], false, 1234)
		_, _ = ParsePrefix(p[:])
		_, _ = ParseTimeout("1500m")
		_ = EncodeMessage(clean)
		_ = DecodeMessage(clean)
	}); n != 0 {
		t.Errorf("%v allocations per run, want 0", n)
	}
}

func BenchmarkEncodeTimeout(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = EncodeTimeout(time.Duration(i%1000+1) * time.Millisecond)
	}
}

func BenchmarkParseTimeout(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, _ = ParseTimeout([...]string{"1S", "250m", "99999999n", "3H"}[i&3])
	}
}
