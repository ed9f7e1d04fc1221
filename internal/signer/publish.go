package signer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// handlePublish publishes an evaluation's .drv files and sources. Nothing here is taken on
// trust: a .drv's store path is recomputed from its text, a source's from the NAR read back from
// the store, and every reference must be in this request or in the cache already.
func (s *Server) handlePublish(ctx context.Context, id nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.PublishRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if err := s.checkEvalClaim(ctx, id, req.Eval); err != nil {
		return nil, err
	}
	srcs, err := parseOutputs("sources", req.Sources)
	if err != nil {
		return nil, err
	}
	drvs := make([]output, len(req.Derivations))
	texts := make([][]byte, len(req.Derivations))
	parsed := make([]*nix.Derivation, len(req.Derivations))
	for i, d := range req.Derivations {
		if drvs[i], texts[i], parsed[i], err = derivationOutput(d); err != nil {
			return nil, badRequest("derivations[%d]: %v", i, err)
		}
	}
	if len(srcs)+len(drvs) == 0 {
		return nil, badRequest("nothing to publish")
	}
	if err := s.checkUploaded(ctx, "sources", srcs); err != nil {
		return nil, err
	}
	err = eachOutput(ctx, srcs, func(ctx context.Context, i int, o output) error {
		ca, err := s.sourceAddress(ctx, o)
		if err != nil {
			return badRequest("sources[%d]: %v", i, err)
		}
		srcs[i].ca = ca
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := s.checkServed(ctx, srcs, drvs); err != nil {
		return nil, err
	}
	hashes, err := s.verifyDerivations(ctx, drvs, parsed)
	if err != nil {
		return nil, err
	}
	// Sources first: the .drv narinfos refer to them.
	var total signerapi.PublishResponse
	if len(srcs) > 0 {
		if err := s.sync(ctx); err != nil {
			return nil, err
		}
		_, resp, err := s.publishAll(ctx, srcs, nil, false)
		if err != nil {
			return nil, err
		}
		total = resp
	}
	resp, err := s.publishDerivations(ctx, drvs, texts, hashes)
	if err != nil {
		return nil, err
	}
	total.Written += resp.Written
	total.Skipped += resp.Skipped
	return total, nil
}

// publishDerivations signs the narinfos of drvs and stores them with the .drv files in the
// database (blob.Derivations), in one statement: a few KiB each, thousands per evaluation, where
// two blob objects per .drv cost more than Nix's whole evaluation. A .drv stored already is left
// as it is: its store path follows from its text.
func (s *Server) publishDerivations(ctx context.Context, drvs []output, texts [][]byte, hashes [][32]byte) (signerapi.PublishResponse, error) {
	var resp signerapi.PublishResponse
	if len(drvs) == 0 {
		return resp, nil
	}
	objs := make([]blob.Derivation, len(drvs))
	err := eachOutput(ctx, drvs, func(ctx context.Context, i int, o output) error {
		ni := &nix.NarInfo{
			StorePath: o.path.String(), URL: o.narKey, Compression: "none",
			FileHash: o.narHash, FileSize: o.narSize, NarHash: o.narHash, NarSize: o.narSize,
			References: o.refBases(), CA: o.ca,
		}
		if err := ni.Sign(s.cfg.Key); err != nil {
			return badRequest("%s: %v", o.path, err)
		}
		text, err := ni.MarshalText()
		if err != nil {
			return badRequest("%s: %v", o.path, err)
		}
		objs[i] = blob.Derivation{StorePath: o.path.String(), NarInfo: text, Text: texts[i], NarHash: o.narSum,
			NarSize: o.narSize, Hash: hashes[i]}
		return nil
	})
	if err != nil {
		return resp, err
	}
	isNew, err := s.drvs.Put(ctx, objs)
	if err != nil {
		return resp, unavailable("storing the .drv files failed", err)
	}
	results := make([]publishResult, len(drvs))
	for i, o := range drvs {
		s.refs.put(o.path.String(), o.refs)
		if isNew[i] {
			results[i] = written
			resp.Written++
			s.metrics.drvWritten(int64(len(texts[i])))
		} else {
			results[i] = skipped
			resp.Skipped++
		}
	}
	s.metrics.published(results)
	return resp, nil
}

// verifyDerivations answers 400 unless every derivation's output paths, and those of the
// derivations below it, are the ones its text gives (in Nix's form: a text Nix would not have
// written is refused too); it returns each one's hash, which is stored with it. Inputs come from
// this request or from the .drv objects the signer stored before, with the hashes it computed
// then: the evaluator's word is taken for nothing.
func (s *Server) verifyDerivations(ctx context.Context, drvs []output, parsed []*nix.Derivation) ([][32]byte, error) {
	index := make(map[string]int, len(drvs))
	var inputs []string
	for i, o := range drvs {
		index[o.path.String()] = i
	}
	for _, d := range parsed {
		for in := range d.InputDrvs {
			if _, ok := index[in]; !ok {
				inputs = append(inputs, in)
			}
		}
	}
	known, err := s.drvs.Hashes(ctx, inputs)
	if err != nil {
		return nil, unavailable("reading the stored derivations failed", err)
	}
	var hash func(string) (nix.DrvHash, error)
	hash = func(p string) (nix.DrvHash, error) {
		if h, ok := known[p]; ok {
			return h, nil
		}
		i, ok := index[p]
		if !ok {
			return nix.DrvHash{}, fmt.Errorf("%s is neither in this request nor in the cache", p)
		}
		if err := parsed[i].CheckOutputs(p, hash); err != nil {
			return nix.DrvHash{}, err
		}
		h, err := parsed[i].Hash(p, hash)
		if err == nil {
			known[p] = h
		}
		return h, err
	}
	sums := make([][32]byte, len(drvs))
	for i, o := range drvs {
		h, err := hash(o.path.String())
		if err != nil {
			return nil, badRequest("derivations[%d]: %v", i, err)
		}
		sums[i] = h.Sum
	}
	return sums, nil
}

// derivationOutput checks that a .drv's store path is the one its text has, and that the text is
// as Nix writes it, and returns it as an output, with its text and parse. Its NAR is served
// uncompressed from the database (blob.DrvNARKey).
func derivationOutput(d signerapi.DerivationText) (output, []byte, *nix.Derivation, error) {
	var o output
	sp, err := nix.ParseStorePath(d.StorePath)
	if err != nil {
		return o, nil, nil, err
	}
	text := []byte(d.Text)
	want, drv, err := nix.DerivationPath(sp.Name, text)
	if err != nil {
		return o, nil, nil, err
	}
	if want != sp.String() {
		return o, nil, nil, errors.New(sp.String() + " is not the store path of this text (it is " + want + ")")
	}
	if !bytes.Equal(drv.Unparse(), text) {
		return o, nil, nil, errors.New(sp.String() + " is not in the form Nix writes a derivation")
	}
	nar := nix.FileNAR(text, false)
	o = output{
		path: sp, narSum: sha256.Sum256(nar), narSize: int64(len(nar)),
		refs: drv.References(), ca: "text:" + nix.FormatSHA256(sha256.Sum256(text)),
	}
	o.narHash = nix.FormatSHA256(o.narSum)
	o.fileSum, o.fileSize = o.narSum, o.narSize
	o.narKey = blob.DrvNARKey(o.narSum)
	o.infoKey = sp.Hash + ".narinfo"
	return o, text, drv, nil
}

// maxWindow bounds the zstd window of an uploaded source the signer decompresses.
const maxWindow = 64 << 20

// sourceAddress reads an uploaded source NAR back and returns its content address: the NAR
// must be the declared one, and the store path must follow from it and the references.
func (s *Server) sourceAddress(ctx context.Context, o output) (string, error) {
	if o.deriver != "" {
		return "", errors.New("a source has no deriver")
	}
	r, _, err := s.cfg.Store.Get(ctx, o.narKey)
	if err != nil {
		return "", unavailable("blob store unavailable", err)
	}
	defer r.Close()
	// Bounded, so an uploaded file cannot make the signer allocate a window of gigabytes (the
	// builders' and evaluators' encoder uses a few MiB).
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxWindow))
	if err != nil {
		return "", err
	}
	defer dec.Close()
	facts, err := nix.InspectNAR(dec)
	if err != nil {
		return "", err
	}
	if facts.NarHash != o.narSum || facts.NarSize != o.narSize {
		return "", errors.New("the uploaded NAR is not the declared one (hash " + nix.FormatSHA256(facts.NarHash) + ")")
	}
	return nix.ContentAddress(o.path.String(), facts, o.refs)
}

// checkServed answers 400 unless every reference of what is published is published with it or
// in the cache already: a narinfo never points at a path the cache cannot serve.
func (s *Server) checkServed(ctx context.Context, parts ...[]output) error {
	batch := map[string]bool{}
	for _, part := range parts {
		for _, o := range part {
			batch[o.path.String()] = true
		}
	}
	checked := map[string]bool{}
	for _, part := range parts {
		for _, o := range part {
			for _, r := range o.refs {
				if batch[r] || checked[r] {
					continue
				}
				_, ok, err := s.servedRefs(ctx, r)
				if err != nil {
					return err
				}
				if !ok {
					return badRequest("%s refers to %s, which is neither published with it nor in the cache", o.path, r)
				}
				checked[r] = true
			}
		}
	}
	return nil
}
