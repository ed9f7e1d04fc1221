package webui

import "net/http"

func (u *UI) registerAuth(mux *http.ServeMux) {}
