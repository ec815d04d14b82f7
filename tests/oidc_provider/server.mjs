// A real OpenID Connect provider for the portal's tests: panva's oidc-provider (OpenID certified)
// on 127.0.0.1, behind node's own http server. `node server.mjs <config.json>`; the config is
// written by tests/oidc_support.py: { port, clients: [...], jwks: { keys: [private RS256 JWK] },
// users_file }.
//
// What it does: the authorization code flow (refresh tokens with offline_access), PKCE (S256) required of every client; scopes
// openid profile email groups, their claims in the ID token as well as at userinfo; RP-initiated
// logout whose page submits itself. Its interactions are a login form of its own (login,
// password) checked against the users file, read again at every lookup so that a test changes a
// user's groups or removes the user between two sign-ins; consent is given for every configured
// client without a page (also when the client asks for it: prompt=consent). A session whose user has been removed from the file asks for a login
// again (prompt=none: error=login_required). Only errors are written to stderr.

import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { randomBytes, createHash, timingSafeEqual } from 'node:crypto';

// oidc-provider 9 warns once, at import, that it wants Node.js 22 LTS; it runs on 20 (the
// machine's), and the warning is no error. Every other notice is avoided by configuration below.
const warn = console.warn;
console.warn = (...args) => {
  if (!String(args[0]).includes('Unsupported runtime')) warn(...args);
};
const { default: Provider, interactionPolicy, errors } = await import('oidc-provider');
console.warn = warn;

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const ISSUER = `http://127.0.0.1:${config.port}`;
const MAX_BODY = 64 * 1024;

// --- The users, from the file at every call

function readUsers() {
  return JSON.parse(readFileSync(config.users_file, 'utf8'));
}

function subOf(login, user) {
  return String(user.claims?.sub ?? login);
}

function accountFor(sub) {
  for (const [login, user] of Object.entries(readUsers())) {
    if (subOf(login, user) === sub) {
      const claims = { ...user.claims, sub };
      return { accountId: sub, claims: () => claims };
    }
  }
  return undefined;
}

function digest(text) {
  return createHash('sha256').update(String(text)).digest();
}

// The account id (sub) of a login and password, or undefined.
function checkPassword(login, password) {
  const users = readUsers();
  const user = Object.hasOwn(users, login) ? users[login] : undefined;
  const expected = user ? user.password : randomBytes(16).toString('hex');
  const same = timingSafeEqual(digest(expected), digest(password));
  return user && same ? subOf(login, user) : undefined;
}

// --- The provider

class MemoryAdapter {
  // oidc-provider's own in-memory adapter warns that it is for development; this one is as
  // small, and the process lives for one test module.
  static store = new Map();

  constructor(name) {
    this.name = name;
  }

  key(id) {
    return `${this.name}:${id}`;
  }

  static live(entry) {
    return entry && (entry.expiresAt === undefined || entry.expiresAt > Date.now()) ? entry : undefined;
  }

  async upsert(id, payload, expiresIn) {
    const expiresAt = expiresIn ? Date.now() + expiresIn * 1000 : undefined;
    MemoryAdapter.store.set(this.key(id), { payload, expiresAt });
    if (payload.uid) MemoryAdapter.store.set(`uid:${this.name}:${payload.uid}`, { payload: id, expiresAt });
  }

  async find(id) {
    return MemoryAdapter.live(MemoryAdapter.store.get(this.key(id)))?.payload;
  }

  async findByUid(uid) {
    const id = MemoryAdapter.live(MemoryAdapter.store.get(`uid:${this.name}:${uid}`))?.payload;
    return id === undefined ? undefined : this.find(id);
  }

  async findByUserCode() {
    return undefined; // no device flow
  }

  async consume(id) {
    const entry = MemoryAdapter.store.get(this.key(id));
    if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) {
    MemoryAdapter.store.delete(this.key(id));
  }

  async revokeByGrantId(grantId) {
    for (const [key, entry] of MemoryAdapter.store) {
      if (entry.payload?.grantId === grantId) MemoryAdapter.store.delete(key);
    }
  }
}

// The login prompt also when the session's user is no longer in the users file.
const policy = interactionPolicy.base();
policy.get('login').checks.push(new interactionPolicy.Check(
  'account_gone',
  'the End-User of the session is no longer known',
  'login_required',
  (ctx) => Boolean(ctx.oidc.session.accountId) && !ctx.oidc.account,
));

function html(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>${html(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body>
${body}
</body>
</html>
`;
}

const provider = new Provider(ISSUER, {
  adapter: MemoryAdapter,
  clients: config.clients.map((client) => ({
    client_id: client.client_id,
    client_secret: client.client_secret,
    client_name: client.client_name ?? client.client_id,
    redirect_uris: client.redirect_uris,
    post_logout_redirect_uris: client.post_logout_redirect_uris ?? [],
    token_endpoint_auth_method: client.token_endpoint_auth_method ?? 'client_secret_post',
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    id_token_signed_response_alg: 'RS256',
  })),
  jwks: config.jwks,
  cookies: { keys: [randomBytes(32).toString('base64url')] },
  responseTypes: ['code'],
  clientAuthMethods: ['client_secret_basic', 'client_secret_post'],
  enabledJWA: { idTokenSigningAlgValues: ['RS256'] },
  pkce: { required: () => true },
  // offline_access: a refresh token that outlives the provider's session (and its logout), as the
  // portal's sync needs; oidc-provider's defaults issue one for that scope only. A refresh whose
  // account is gone is refused (invalid_grant).
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'given_name', 'family_name', 'middle_name', 'nickname', 'preferred_username',
      'profile', 'picture', 'website', 'gender', 'birthdate', 'zoneinfo', 'locale', 'updated_at', 'uid'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  conformIdTokenClaims: false,
  findAccount: (ctx, sub) => accountFor(sub),
  // Consent: every configured client is granted the OIDC scopes and claims it asks for.
  async loadExistingGrant(ctx) {
    const { oidc } = ctx;
    const grantId = oidc.result?.consent?.grantId || oidc.session.grantIdFor(oidc.client.clientId);
    let grant = grantId ? await oidc.provider.Grant.find(grantId) : undefined;
    if (!grant || grant.accountId !== oidc.account.accountId) {
      grant = new oidc.provider.Grant({ clientId: oidc.client.clientId, accountId: oidc.account.accountId });
    }
    grant.addOIDCScope([...oidc.requestParamOIDCScopes].join(' '));
    grant.addOIDCClaims([...oidc.requestParamClaims]);
    await grant.save();
    return grant;
  },
  interactions: { policy, url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  features: {
    devInteractions: { enabled: false },
    pushedAuthorizationRequests: { enabled: false },
    userinfo: { enabled: true },
    rpInitiatedLogout: {
      enabled: true,
      // The confirmation submits itself (logout=yes): the browser goes on to the client's
      // post_logout_redirect_uri without a click.
      async logoutSource(ctx, form) {
        const yes = form.replace('</form>', '<input type="hidden" name="logout" value="yes"/></form>');
        ctx.body = page('Signing out', `<main>
<h1>Signing out</h1>
${yes}
<noscript><button type="submit" form="op.logoutForm">Sign out</button></noscript>
<script>document.forms[0].submit()</script>
</main>`);
      },
      async postLogoutSuccessSource(ctx) {
        ctx.body = page('Signed out', '<main><h1>Signed out</h1></main>');
      },
    },
  },
  clientBasedCORS: () => false,
  async renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = page('Error', `<main><h1>Error</h1>
<p id="error">${html(out.error)}</p><p id="error-description">${html(out.error_description ?? '')}</p></main>`);
  },
  ttl: {
    AccessToken: 3600,
    AuthorizationCode: 60,
    IdToken: 3600,
    Interaction: 3600,
    Session: 24 * 3600,
    Grant: 24 * 3600,
  },
});

provider.on('server_error', (ctx, err) => {
  console.error(`oidc-provider server_error ${ctx.method} ${ctx.path}:`, err);
});

// --- The interactions: a login form (consent is given by loadExistingGrant)

function loginPage(uid, clientName, { login = '', error = '' } = {}) {
  const alert = error ? `<p id="login-error" role="alert">${html(error)}</p>\n` : '';
  return page(`Sign in to ${clientName}`, `<main>
<h1>Sign in</h1>
<p>to continue to <strong id="client-name">${html(clientName)}</strong></p>
${alert}<form method="post" action="/interaction/${html(uid)}" autocomplete="off">
<p><label for="login">Login</label> <input id="login" name="login" value="${html(login)}" autofocus required></p>
<p><label for="password">Password</label> <input id="password" name="password" type="password" required></p>
<p><button type="submit">Sign in</button></p>
</form>
</main>`);
}

function send(res, status, body) {
  res.statusCode = status;
  res.setHeader('Content-Type', 'text/html; charset=utf-8');
  res.setHeader('Cache-Control', 'no-store');
  res.end(body);
}

function readForm(req) {
  return new Promise((resolve, reject) => {
    let size = 0;
    const chunks = [];
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) {
        reject(new Error('request body too large'));
        req.destroy();
      } else {
        chunks.push(chunk);
      }
    });
    req.on('end', () => resolve(new URLSearchParams(Buffer.concat(chunks).toString('utf8'))));
    req.on('error', reject);
  });
}

async function interaction(req, res, uid) {
  let details;
  try {
    details = await provider.interactionDetails(req, res);
  } catch (err) {
    if (err instanceof errors.SessionNotFound) {
      send(res, 400, page('Error', '<main><h1>This sign-in has expired</h1></main>'));
      return;
    }
    throw err;
  }
  if (details.uid !== uid) {
    send(res, 400, page('Error', '<main><h1>This sign-in has expired</h1></main>'));
    return;
  }
  const client = await provider.Client.find(details.params.client_id);
  const clientName = client?.clientName ?? details.params.client_id;

  if (details.prompt.name === 'consent') {
    // Asked for (prompt=consent: the spec's condition for offline_access): the user consents to
    // what a configured client asks, without a page.
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    const missing = details.prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    const grantId = await grant.save();
    await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
    return;
  }
  if (details.prompt.name !== 'login') {
    throw new Error(`unexpected prompt ${details.prompt.name}: ${JSON.stringify(details.prompt.details)}`);
  }
  if (req.method === 'GET') {
    send(res, 200, loginPage(uid, clientName, { login: details.params.login_hint ?? '' }));
    return;
  }
  if (req.method !== 'POST') {
    send(res, 405, page('Error', '<main><h1>Method not allowed</h1></main>'));
    return;
  }
  const form = await readForm(req);
  const login = form.get('login') ?? '';
  const accountId = checkPassword(login, form.get('password') ?? '');
  if (!accountId) {
    send(res, 200, loginPage(uid, clientName, { login, error: 'Wrong login or password.' }));
    return;
  }
  await provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
}

const handle = provider.callback();
const INTERACTION = /^\/interaction\/([A-Za-z0-9_-]+)$/;

const server = createServer((req, res) => {
  const match = INTERACTION.exec(new URL(req.url, ISSUER).pathname);
  if (!match) {
    handle(req, res);
    return;
  }
  interaction(req, res, match[1]).catch((err) => {
    console.error(`interaction ${req.method} ${req.url}:`, err);
    if (!res.headersSent) send(res, 500, page('Error', '<main><h1>Server error</h1></main>'));
    else res.end();
  });
});

server.listen(config.port, '127.0.0.1');
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => process.exit(0)); // nothing to keep: the store is in memory
}
