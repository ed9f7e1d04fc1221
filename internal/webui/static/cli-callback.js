// Hands a freshly minted token to harmonia-ci login's loopback listener: the form posts it,
// so it never appears in a URL. Without JavaScript the user clicks the form's button.
document.getElementById("cli-callback").submit();
