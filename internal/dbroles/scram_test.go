package dbroles

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
)

// TestScramVerifierRFC7677 checks the verifier against the exchange of RFC 7677 section 3
// (user "user", password "pencil"): the client proof it gives must verify against our
// StoredKey, and our ServerKey must give its server signature.
func TestScramVerifierRFC7677(t *testing.T) {
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	v, err := scramVerifier("pencil", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if !verifierPattern.MatchString(v) {
		t.Fatalf("verifier %q does not match its pattern", v)
	}
	keys := v[strings.LastIndex(v, "$")+1:]
	storedB64, serverB64, _ := strings.Cut(keys, ":")
	stored, _ := base64.StdEncoding.DecodeString(storedB64)
	server, _ := base64.StdEncoding.DecodeString(serverB64)

	authMessage := "n=user,r=rOprNGfwEbeRWgbNEkqO," +
		"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096," +
		"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	proof, _ := base64.StdEncoding.DecodeString("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
	sig := hmacSHA256(stored, authMessage)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ sig[i]
	}
	if got := sha256.Sum256(clientKey); !hmac.Equal(got[:], stored) {
		t.Fatal("the RFC's client proof does not verify against the StoredKey")
	}
	wantServerSig, _ := base64.StdEncoding.DecodeString("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
	if !hmac.Equal(hmacSHA256(server, authMessage), wantServerSig) {
		t.Fatal("the ServerKey does not give the RFC's server signature")
	}
}
