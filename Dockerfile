# One image for web, worker and beat (docker-compose.yml picks the command).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 VAR_DIR=/var/lib/portal
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-client gettext curl \
    libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fonts-wqy-microhei \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /home/portal portal \
 && mkdir -p /var/lib/portal && chown portal /var/lib/portal

WORKDIR /app
COPY pyproject.toml ./
# python-ldap (the `ldap` extra) compiles against libldap; the compiler and headers leave after.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libldap2-dev libsasl2-dev \
 && pip install --no-cache-dir -e ".[ldap]" \
 && apt-get purge -y --auto-remove gcc libldap2-dev libsasl2-dev \
 && apt-get install -y --no-install-recommends libldap-2.5-0 libsasl2-2 \
 && rm -rf /var/lib/apt/lists/*
COPY . .
# Building needs a key to import settings; this throwaway one never serves a request.
RUN export SECRET_KEY=build-only-not-a-real-key-0000000000000 \
 && python manage.py compilemessages -v0 \
 && python manage.py collectstatic --noinput -v0 \
 && chown -R portal /var/lib/portal

# Numeric, so that Kubernetes can check runAsNonRoot (deploy/kubernetes/portal.yaml).
USER 10001
EXPOSE 8000
CMD ["gunicorn", "portal.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--access-logfile", "-"]
