// Package grpcwire holds the gRPC-over-HTTP/2 wire rules that this
// repository's own HTTP/2 peers share: the lean server transport
// (frontend/h2unary) and the load generator's client (bench/h2client).
// Each rule is here once, as the pair its two ends need:
//
//   - grpc-timeout: AppendTimeout/EncodeTimeout (client) and ParseTimeout
//     (server);
//   - grpc-message: EncodeMessage (server) and DecodeMessage (client);
//   - the 5-byte message prefix: PutPrefix and ParsePrefix;
//   - -bin metadata values: DecodeBinHeader, padded or not;
//   - the status a client reads from a stream that ended without
//     grpc-status: ResetCode (RST_STREAM) and HTTPStatusCode (:status).
//
// It lives in the shared proto module rather than under internal/ because
// its users are in different modules (frontend, bench); it is not meant
// for use outside this repository. The rules are those of gRPC's
// PROTOCOL-HTTP2 spec, and the tests hold them to grpc-go's peers in both
// directions. Nothing here allocates where the callers' hot paths use it
// (prefixes, clean messages, timeouts appended into a caller's buffer).
package grpcwire

import (
	"encoding/base64"
	"encoding/binary"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// PrefixLen is the size of the prefix before each gRPC message: a
// compressed flag and a big-endian 4-byte length.
const PrefixLen = 5

// PutPrefix writes the prefix of an n-byte message into p[:PrefixLen].
func PutPrefix(p []byte, compressed bool, n uint32) {
	_ = p[PrefixLen-1]
	p[0] = 0
	if compressed {
		p[0] = 1
	}
	binary.BigEndian.PutUint32(p[1:PrefixLen], n)
}

// ParsePrefix reads the prefix in p[:PrefixLen]: whether the message is
// compressed (any flag byte but 0; this repository's peers speak identity
// only and refuse every other flag alike) and its length.
func ParsePrefix(p []byte) (compressed bool, n uint32) {
	_ = p[PrefixLen-1]
	return p[0] != 0, binary.BigEndian.Uint32(p[1:PrefixLen])
}

// MaxTimeoutDigits is the most digits a grpc-timeout value may have.
const MaxTimeoutDigits = 8

const maxTimeoutValue = 99999999 // MaxTimeoutDigits nines

var timeoutUnits = [...]struct {
	d time.Duration
	c byte
}{{time.Nanosecond, 'n'}, {time.Microsecond, 'u'}, {time.Millisecond, 'm'}, {time.Second, 'S'}, {time.Minute, 'M'}, {time.Hour, 'H'}}

// unitByName is timeoutUnits by unit letter, for ParseTimeout.
var unitByName = [128]time.Duration{'n': time.Nanosecond, 'u': time.Microsecond, 'm': time.Millisecond, 'S': time.Second, 'M': time.Minute, 'H': time.Hour}

// AppendTimeout appends d as a grpc-timeout value to dst: at most eight
// digits, in the finest unit that fits, rounded up so that the server
// never sees a shorter deadline than the client keeps. d <= 0 is "0n".
func AppendTimeout(dst []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(dst, '0', 'n')
	}
	for _, u := range timeoutUnits {
		n := d / u.d
		if d%u.d != 0 {
			n++
		}
		if n <= maxTimeoutValue {
			return append(strconv.AppendInt(dst, int64(n), 10), u.c)
		}
	}
	// Unreachable: math.MaxInt64 ns is about 2.6 million hours.
	return append(strconv.AppendInt(dst, maxTimeoutValue, 10), 'H')
}

// EncodeTimeout is AppendTimeout as a string (one allocation).
func EncodeTimeout(d time.Duration) string {
	var b [MaxTimeoutDigits + 1]byte
	return string(AppendTimeout(b[:0], d))
}

// ParseTimeout reads a grpc-timeout value: up to eight digits and a unit
// (H, M, S, m, u, n). A value past time.Duration's range is clamped to it.
func ParseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > MaxTimeoutDigits+1 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	if c := v[len(v)-1]; int(c) < len(unitByName) {
		unit = unitByName[c]
	}
	if unit == 0 {
		return 0, false
	}
	if n > int64(1<<63-1)/int64(unit) {
		return 1<<63 - 1, true
	}
	return time.Duration(n) * unit, true
}

// messageEscaped reports whether b is percent-encoded in grpc-message:
// bytes outside printable ASCII, and '%' itself.
func messageEscaped(b byte) bool { return b < ' ' || b > '~' || b == '%' }

// EncodeMessage percent-encodes msg for grpc-message as the gRPC spec
// requires (bytes outside printable ASCII, and '%', as %XX with upper-case
// hex). A message with none of them is returned as is, without
// allocating.
func EncodeMessage(msg string) string {
	i := 0
	for i < len(msg) && !messageEscaped(msg[i]) {
		i++
	}
	if i == len(msg) {
		return msg
	}
	const hex = "0123456789ABCDEF"
	var sb strings.Builder
	sb.Grow(len(msg) + 8)
	sb.WriteString(msg[:i])
	for ; i < len(msg); i++ {
		if b := msg[i]; messageEscaped(b) {
			sb.WriteByte('%')
			sb.WriteByte(hex[b>>4])
			sb.WriteByte(hex[b&15])
		} else {
			sb.WriteByte(b)
		}
	}
	return sb.String()
}

// DecodeMessage decodes a grpc-message value. A value that is not wholly
// valid percent-encoding is returned as it came (grpc-go instead decodes
// the valid escapes and keeps the rest; no conforming sender writes one).
// A value without '%' is returned as is, without allocating.
func DecodeMessage(v string) string {
	if m, err := url.PathUnescape(v); err == nil {
		return m
	}
	return v
}

// DecodeBinHeader decodes the value of a -bin metadata header: base64,
// padded or not, as grpc-go accepts (and grpc-go sends it unpadded).
func DecodeBinHeader(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// ResetCode is the status of a call whose stream the server reset, by
// the RST_STREAM error code, as gRPC's spec maps it: REFUSED_STREAM is
// UNAVAILABLE, CANCEL is CANCELLED (a client that finds its own deadline
// passed reads it as DEADLINE_EXCEEDED), ENHANCE_YOUR_CALM is
// RESOURCE_EXHAUSTED, INADEQUATE_SECURITY is PERMISSION_DENIED, and every
// other code INTERNAL. grpc-go's client differs in two cases: it reads
// FLOW_CONTROL_ERROR as RESOURCE_EXHAUSTED and a code HTTP/2 does not
// define as UNKNOWN.
func ResetCode(e http2.ErrCode) codes.Code {
	switch e {
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeCancel:
		return codes.Canceled
	case http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted
	case http2.ErrCodeInadequateSecurity:
		return codes.PermissionDenied
	}
	return codes.Internal
}

// HTTPStatusCode is the status of a response that carries HTTP status
// code httpStatus and no grpc-status, as gRPC's spec ("HTTP to gRPC
// Status Code Mapping") and grpc-go's client map it. (grpc-go's client
// maps it only for a response whose content-type is not gRPC's, and reads
// a gRPC response without grpc-status as UNKNOWN.)
func HTTPStatusCode(httpStatus int) codes.Code {
	switch httpStatus {
	case 400:
		return codes.Internal
	case 401:
		return codes.Unauthenticated
	case 403:
		return codes.PermissionDenied
	case 404:
		return codes.Unimplemented
	case 429, 502, 503, 504:
		return codes.Unavailable
	}
	return codes.Unknown
}
