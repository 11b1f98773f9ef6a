package flood

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
)

// TLS code points used by the ClientHello (RFC 8446 and the IANA registries).
const (
	tlsRecordHandshake      = 22
	tlsHandshakeClientHello = 1

	tlsVersion10 = 0x0301 // legacy record version of a first ClientHello
	tlsVersion12 = 0x0303
	tlsVersion13 = 0x0304

	extServerName          = 0
	extSupportedGroups     = 10
	extECPointFormats      = 11
	extSignatureAlgorithms = 13
	extALPN                = 16
	extSupportedVersions   = 43
	extPSKKeyExchangeModes = 45
	extKeyShare            = 51

	groupX25519    = 0x001d
	groupSecp256r1 = 0x0017
	groupSecp384r1 = 0x0018
)

// clientHelloCipherSuites offers the three TLS 1.3 suites first, then the
// ECDHE AEAD suites a TLS 1.2 server would pick, as browsers do.
var clientHelloCipherSuites = []uint16{
	0x1301, // TLS_AES_128_GCM_SHA256
	0x1302, // TLS_AES_256_GCM_SHA384
	0x1303, // TLS_CHACHA20_POLY1305_SHA256
	0xc02b, // TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
	0xc02f, // TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
	0xc02c, // TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
	0xc030, // TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
	0xcca9, // TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
	0xcca8, // TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
}

var clientHelloSignatureSchemes = []uint16{
	0x0403, // ecdsa_secp256r1_sha256
	0x0804, // rsa_pss_rsae_sha256
	0x0401, // rsa_pkcs1_sha256
	0x0503, // ecdsa_secp384r1_sha384
	0x0805, // rsa_pss_rsae_sha384
	0x0501, // rsa_pkcs1_sha384
	0x0806, // rsa_pss_rsae_sha512
	0x0601, // rsa_pkcs1_sha512
}

// tlsWriter appends TLS wire encodings. Vectors carry a length prefix that is
// filled in once their body is written.
type tlsWriter struct{ b []byte }

func (w *tlsWriter) u8(v uint8)   { w.b = append(w.b, v) }
func (w *tlsWriter) u16(v uint16) { w.b = append(w.b, byte(v>>8), byte(v)) }
func (w *tlsWriter) bytes(v []byte) {
	w.b = append(w.b, v...)
}

// vector writes a body produced by fill, preceded by its length in
// prefixLen bytes (1, 2 or 3).
func (w *tlsWriter) vector(prefixLen int, fill func()) {
	at := len(w.b)
	w.b = append(w.b, make([]byte, prefixLen)...)
	fill()
	n := len(w.b) - at - prefixLen
	for i := range prefixLen {
		w.b[at+i] = byte(n >> (8 * (prefixLen - 1 - i)))
	}
}

func (w *tlsWriter) extension(typ uint16, fill func()) {
	w.u16(typ)
	w.vector(2, fill)
}

// clientHello builds one TLS record holding a ClientHello that offers TLS 1.3
// and 1.2, the way a current browser opens a connection: SNI, ALPN, an X25519
// key share and the middlebox-compatibility session ID. Random values are
// fresh per call; the generator then sends the same record on every flow.
func clientHello(serverName string) ([]byte, error) {
	if serverName == "" || len(serverName) > 255 {
		return nil, fmt.Errorf("server name %q: want 1 to 255 bytes", serverName)
	}
	random := make([]byte, 32)
	sessionID := make([]byte, 32)
	rand.Read(random)
	rand.Read(sessionID)
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	keyShare := key.PublicKey().Bytes()

	w := &tlsWriter{}
	w.u8(tlsRecordHandshake)
	w.u16(tlsVersion10)
	w.vector(2, func() { // record body
		w.u8(tlsHandshakeClientHello)
		w.vector(3, func() { // handshake body
			w.u16(tlsVersion12) // legacy_version; 1.3 is offered in supported_versions
			w.bytes(random)
			w.vector(1, func() { w.bytes(sessionID) })
			w.vector(2, func() {
				for _, s := range clientHelloCipherSuites {
					w.u16(s)
				}
			})
			w.vector(1, func() { w.u8(0) }) // compression: null only
			w.vector(2, func() {            // extensions
				w.extension(extServerName, func() {
					w.vector(2, func() { // server_name_list
						w.u8(0) // host_name
						w.vector(2, func() { w.bytes([]byte(serverName)) })
					})
				})
				w.extension(extSupportedGroups, func() {
					w.vector(2, func() {
						w.u16(groupX25519)
						w.u16(groupSecp256r1)
						w.u16(groupSecp384r1)
					})
				})
				w.extension(extECPointFormats, func() {
					w.vector(1, func() { w.u8(0) }) // uncompressed
				})
				w.extension(extSignatureAlgorithms, func() {
					w.vector(2, func() {
						for _, s := range clientHelloSignatureSchemes {
							w.u16(s)
						}
					})
				})
				w.extension(extALPN, func() {
					w.vector(2, func() {
						for _, p := range []string{"h2", "http/1.1"} {
							w.vector(1, func() { w.bytes([]byte(p)) })
						}
					})
				})
				w.extension(extSupportedVersions, func() {
					w.vector(1, func() {
						w.u16(tlsVersion13)
						w.u16(tlsVersion12)
					})
				})
				w.extension(extPSKKeyExchangeModes, func() {
					w.vector(1, func() { w.u8(1) }) // psk_dhe_ke
				})
				w.extension(extKeyShare, func() {
					w.vector(2, func() { // client_shares
						w.u16(groupX25519)
						w.vector(2, func() { w.bytes(keyShare) })
					})
				})
			})
		})
	})
	return w.b, nil
}
