package githubtest

import (
	"net/http"
	"strings"
)

// Users. GitHub users have a numeric id that never changes and a login they can rename; a
// login given up can be taken by another account. The stand-in's users exist implicitly (any
// login is a user, with id numericID(login)) until RenameUser and CreateUser say otherwise.
//
//   - GET /users/{login} (as an installation): the user, 404 for a login nobody has.

// freeLogin marks a login in userIDs that no account has.
const freeLogin = -1

// UserID is the id of the account that has login now (freeLogin if none).
func (s *Server) UserID(login string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.userID(login)
}

func (s *Server) userID(login string) int64 {
	if id, ok := s.userIDs[strings.ToLower(login)]; ok {
		return id
	}
	return numericID(login)
}

// RenameUser renames the account that has login from to to: it keeps its id, and from is free.
func (s *Server) RenameUser(from, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.userIDs == nil {
		s.userIDs = map[string]int64{}
	}
	s.userIDs[strings.ToLower(to)] = s.userID(from)
	s.userIDs[strings.ToLower(from)] = freeLogin
}

// CreateUser makes a new account with login (a free one, or one taken over): it gets a new id.
func (s *Server) CreateUser(login string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.userIDs == nil {
		s.userIDs = map[string]int64{}
	}
	s.nextID++
	s.userIDs[strings.ToLower(login)] = s.nextID
	return s.nextID
}

// userJSON is userJSON with the id the account has now.
func (s *Server) userJSON(login string) map[string]any {
	s.mu.Lock()
	id := s.userID(login)
	s.mu.Unlock()
	u := userJSON(login)
	u["id"] = id
	return u
}

func (s *Server) userByLogin(w http.ResponseWriter, r *http.Request, _ int64) {
	login := r.PathValue("login")
	if s.UserID(login) == freeLogin {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, s.userJSON(login))
}
